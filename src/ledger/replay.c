/* The replay engine: one micro-batch's forward and backward as allocation
 * and free events per category, block by block (docs/ledger.md). The
 * iteration around it (model states, accumulation, the optimizer step) is
 * evaluate.c's. */
#include <stdio.h>
#include <string.h>

#include "ledger/replay.h"
#include "util/grow.h"

static inline __attribute__((always_inline)) void event(ml_replay *r, ml_category c, int64_t delta)
{
    /* after an overflow the plan is refused: nothing more to count */
    if (delta == 0 || r->overflow)
        return;
    ml_summary *s = &r->l->sum;
    /* the level the event starts from is part of its phase */
    ml__replay_enter(r);
    if (delta > 0) {
        uint64_t d = (uint64_t)delta;
        if (__builtin_add_overflow(r->live[c], d, &r->live[c]) ||
            __builtin_add_overflow(r->total, d, &r->total))
            r->overflow = true;
        if (r->live[c] > s->category_max[c])
            s->category_max[c] = r->live[c];
        ml__replay_rise(r, r->total, r->live);
    } else {
        uint64_t d = (uint64_t)(-delta);
        if (d > r->live[c] || d > r->total) {
            r->underflow = true; /* a bug in the plan: caught by the tests */
            return;
        }
        r->live[c] -= d;
        r->total -= d;
    }
    if (!r->keep)
        return;
    ml_ledger *l = r->l;
    ml_event *grown = ml_grow(l->events, l->nevents, &l->cap, sizeof *grown, 256);
    if (!grown) {
        r->nomem = true;
        r->keep = false;
        return;
    }
    l->events = grown;
    ml_event *e = &l->events[l->nevents++];
    e->phase = r->phase;
    e->block = r->block;
    e->micro = r->micro;
    e->cat = c;
    e->delta = delta;
    memcpy(e->live, r->live, sizeof r->live);
    e->flops_before = r->flops_done;
    e->comm_before = r->comm_done;
    e->host_before = r->host_done;
    e->t_s = -1; /* set once the step time is known */
}

/* b through the allocator simulation, and where its reserved bytes peak;
 * not inlined, so that ml__replay_alloc_as is (14 % of a plan, --grid). */
__attribute__((noinline)) static void simulated_alloc(ml_replay *r, ml_category c, uint64_t b,
                                                     ml_tensor_split split, size_t block,
                                                     unsigned copies)
{
    ml__rsim_alloc(r->rsim, c, b, split, block, copies);
    ml__replay_reserved_point(r);
}

size_t ml__replay_sim_tensor(ml_replay *r, ml_category c, uint64_t b)
{
    simulated_alloc(r, c, b, ML_T_ONE, 0, 1);
    return ml__rsim_latest(r->rsim, c);
}

void ml__replay_alloc_event(ml_replay *r, ml_category c, uint64_t b, ml_tensor_split split,
                            size_t block, unsigned copies)
{
    if (b > (uint64_t)INT64_MAX) {
        r->overflow = true;
        return;
    }
    event(r, c, (int64_t)b);
    if (r->rsim)
        simulated_alloc(r, c, b, split, block, copies);
}

void ml__replay_ledger_event(ml_replay *r, ml_category c, int64_t delta)
{
    event(r, c, delta);
}

void ml__replay_free_event(ml_replay *r, ml_category c, uint64_t b)
{
    if (b > (uint64_t)INT64_MAX) {
        r->overflow = true;
        return;
    }
    event(r, c, -(int64_t)b);
    if (r->rsim)
        ml__rsim_free(r->rsim, c, b);
}

/* ZeRO-3 / FSDP: a block's parameters are gathered for its forward and its
 * backward, with the next block's prefetched (docs/sharding.md). */
static uint64_t gathered(ml_replay *r, size_t k, bool backward)
{
    const ml_shard *sh = r->sh;
    if (!sh->gather_params)
        return 0;
    const ml_chain *ch = r->ch;
    uint64_t e = ch->blocks[k].params;
    if (backward ? k > 0 : k + 1 < ch->n)
        e += ch->blocks[backward ? k - 1 : k + 1].params;
    uint64_t b;
    if (__builtin_mul_overflow(e, (uint64_t)sh->pbytes, &b))
        r->overflow = true;
    return b;
}

/* ZeRO-3: once its buffer is allocated, block k's own parameters are
 * all-gathered into it (from the host first under offload: params); the
 * prefetched next block's count when it runs (docs/sharding.md, "Time"). */
static void gather_time(ml_replay *r, size_t k)
{
    const ml_shard *sh = r->sh;
    if (!sh->gather_params)
        return;
    double own = (double)r->ch->blocks[k].params * sh->pbytes;
    r->comm_done += ml__ep_ring(r->ch, &r->ch->blocks[k], sh->N, own, sh->pbytes);
    if (sh->host_params)
        r->host_done += own / (double)sh->N;
}

/* A block whose forward computes its gradients (logits: fused) allocates
 * them first: its parameters' (the new .grad in the first micro-batch, a
 * gradient added into .grad at its backward after) and its input's, which
 * its backward hands to the block before it. */
static void fwd_grads(ml_replay *r, size_t k)
{
    const ml_cblock *b = &r->ch->blocks[k];
    if (!b->grads_in_fwd)
        return;
    bool create = r->micro == 0 && !r->grads_exist;
    ml__replay_alloc_as(r, create ? ML_CAT_GRADS : ML_CAT_WORKSPACE, b->grad_bytes,
                        ML_T_BLOCK_PARAMS, k, 1);
    ml__replay_alloc(r, ML_CAT_WORKSPACE, b->in_bytes);
}

/* Its backward: the gradient added into .grad after the first micro-batch
 * is freed; the input's goes to the block before it (node-level: as the
 * carried gradient; block-level: that block's estimate counts its own). */
static void fwd_grads_done(ml_replay *r, size_t k, bool carried)
{
    const ml_cblock *b = &r->ch->blocks[k];
    if (!b->grads_in_fwd)
        return;
    /* (a tied table's partial waits in the buffer for the embedding's
     * backward: freed there, ml__tied_sum) */
    if ((r->micro != 0 || r->grads_exist) && !(r->tied_partial && b->tied_grad == r->tied_partial))
        ml__replay_free(r, ML_CAT_WORKSPACE, b->grad_bytes);
    if (!carried)
        ml__replay_free(r, ML_CAT_WORKSPACE, b->in_bytes);
}

/* A thread's first matrix product (block k's, with FLOPs) makes its cuBLAS
 * handle's workspace once its output exists: *pending bytes, kept for the
 * process's life (ml_device.blas_workspace; docs/allocator.md, "cuBLAS's
 * workspaces"). */
static void blas_workspace(ml_replay *r, size_t k, uint64_t *pending)
{
    if (*pending && r->rsim && r->ch->blocks[k].flops_fwd > 0) {
        ml__rsim_pin(r->rsim, *pending);
        ml__replay_reserved_point(r);
        *pending = 0;
    }
}

/* Block k's forward; with grad unless it is checkpointed (seg[k] >= 0). */
static void forward_block(ml_replay *r, size_t k)
{
    const ml_chain *ch = r->ch;
    const ml_shard *sh = r->sh;
    const int *seg = r->seg;
    const size_t n = ch->n;
    const ml_cblock *B = ch->blocks, *b = &B[k];
    r->phase = b->fwd_phase;
    r->block = (int32_t)k;
    /* a checkpointed block runs under no_grad: nothing is saved, and
     * what would be saved is transient */
    uint64_t ws = seg[k] < 0 ? b->ws_fwd : b->ws_nograd;
    /* the attention mask the model's forward makes before its layers
     * and holds through them (docs/ledger.md, "Boundary tensors") */
    const bool layer = b->ckpt_index >= (int)ch->mask_ckpt0;
    const uint64_t mask = ch->mask_in_forward ? ch->ckpt_side : 0;
    if (layer && b->ckpt_index == (int)ch->mask_ckpt0)
        ml__replay_alloc_as(r, ML_CAT_WORKSPACE, mask, ML_T_SIDE, 0, 1);
    uint64_t gat = gathered(r, k, false);
    ml__replay_alloc(r, ML_CAT_WORKSPACE, gat);
    gather_time(r, k);
    if (seg[k] < 0)
        fwd_grads(r, k);
    /* a block whose forward is known op by op: the simulation makes its
     * tensors, the ledger counts the transient (and with grad the saved
     * tensors) as one figure */
    const bool steps = ml__replay_steps_begin(r, k, seg[k] < 0, ML_CAT_ACTIVATIONS);
    if (!steps) {
        ml__replay_alloc_as(r, ML_CAT_WORKSPACE, ws, seg[k] < 0 ? ML_T_UNITS_FWD : ML_T_UNITS,
                            k, 1);
        if (seg[k] < 0 && !b->fwd_only) /* (an unused layer's: a side tensor) */
            ml__replay_alloc_as(r, ML_CAT_ACTIVATIONS,
                                b->saved_bytes - (r->selective ? b->core_bytes : 0),
                                r->selective ? ML_T_SAVED_NONCORE : ML_T_SAVED, k, 1);
    }
    blas_workspace(r, k, &r->blas_fwd);
    ml__sides_forward(r, k, true);
    if ((int)k == sh->side_block)
        ml__side_kept(r, mask);
    /* an in-place op (relu inplace: true) makes its output in its
     * input's storage: the input goes first */
    if (b->inplace)
        ml__boundary_input_done(r, k);
    if (k + 1 < n)
        ml__boundary_alloc(r, k + 1, r->bd[k + 1].alias ? 0 : B[k + 1].in_bytes);
    r->flops_done += b->flops_fwd; /* the block runs: what follows is after it */
    ml__replay_steps_end(r, k, seg[k] < 0, ML_CAT_ACTIVATIONS, steps);
    ml__replay_free(r, ML_CAT_WORKSPACE, gat);
    /* autocast's weight copies, which its cache holds to the region's end
     * (docs/precision.md): made by the steps without grad, where they ran */
    const bool copies = steps && seg[k] >= 0 && b->nfcopies;
    if (r->hold_cache) { /* the output's keys and values; autocast's weight copies */
        ml__replay_alloc_as(r, ML_CAT_WORKSPACE, b->cache_bytes + (copies ? 0 : b->cast_bytes),
                            ML_T_HELD, k, 1);
    } else if (seg[k] >= 0 && b->cast_bytes && !copies) { /* checkpointed */
        ml__replay_alloc(r, ML_CAT_WORKSPACE, b->cast_bytes); /* to the loss (precision.md) */
    }
    if (copies) /* the ledger's count of them */
        ml__replay_ledger_event(r, ML_CAT_WORKSPACE, (int64_t)b->cast_bytes);
    if (r->train_cache && b->out_cache_bytes) { /* the output's cache, in training */
        ml__replay_alloc(r, ML_CAT_WORKSPACE, b->out_cache_bytes);
        if (r->rsim)
            ml__rsim_cache_note(r->rsim, k);
        r->cache_out += b->out_cache_bytes;
    }
    ml__boundary_input_done(r, k);
    ml__sides_forward(r, k, false);
    /* the model's forward returns after its last layer */
    if (layer && sh->side_block < 0 && (k + 1 == n || B[k + 1].ckpt_index < 0))
        ml__replay_free(r, ML_CAT_WORKSPACE, mask);
    /* the loop rebinds its reference once this loss is computed */
    if (b->in_held)
        ml__replay_drop_prev(r);
}

void ml__replay_forward(ml_replay *r)
{
    const size_t n = r->ch->n;
    r->phase = ML_PHASE_FORWARD;
    r->block = 0;
    ml__boundary_alloc(r, 0, r->ch->blocks[0].in_bytes);
    ml_run u = {.streak = 0};
    for (size_t k = 0; k < n && !r->overflow; k++) { /* an overflow ends the plan */
        k = ml__run_skip(&u, r, k, 1);
        if (r->overflow)
            break;
        ml__run_before(&u, r);
        forward_block(r, k);
        ml__run_after(&u, r, k, 1);
    }
    /* logits released or fused: the loop keeps the loss alone, and the
     * output's cache goes with the output once the forward returns */
    if (!r->keep_output && r->cache_out) {
        ml__out_cache_free(r, r->cache_out, false);
        r->cache_out = 0;
    }
    /* autocast's region ends: its cache goes, a checkpointed block's copies
     * at a time (replayed or moved over, each block allocated its own) */
    for (size_t k = 0; k < n && !r->hold_cache; k++)
        if (r->seg[k] >= 0 && r->ch->blocks[k].cast_bytes)
            ml__replay_free(r, ML_CAT_WORKSPACE, r->ch->blocks[k].cast_bytes);
    r->act_end = r->live[ML_CAT_ACTIVATIONS];
}

/* The first block of the checkpoint segment block k ends. */
static size_t segment_start(const int *seg, size_t k)
{
    size_t s0 = k;
    while (s0 > 0 && seg[s0 - 1] == seg[k])
        s0--;
    return s0;
}

/* The simulation's name for the workspace of b bytes just made (or 0). */
static size_t named(const ml_replay *r, uint64_t b)
{
    return b && r->rsim ? ml__rsim_latest(r->rsim, ML_CAT_WORKSPACE) : 0;
}

void ml__replay_free_named(ml_replay *r, ml_category c, uint64_t b, size_t name)
{
    if (!name || !r->rsim || b > (uint64_t)INT64_MAX) {
        ml__replay_free(r, c, b);
        return;
    }
    event(r, c, -(int64_t)b);
    ml__rsim_free_as(r->rsim, c, name, b);
}

/* Frees b bytes of workspace made as `name` (0: as ml__replay_free). */
static void free_named(ml_replay *r, uint64_t b, size_t name)
{
    ml__replay_free_named(r, ML_CAT_WORKSPACE, b, name);
}

/* The previous micro-batch's received gradient goes once this one's is
 * received (the new tensor made, then the old reference rebound): called
 * after the stage's incoming gradient is allocated, and at the end of the
 * backward (r->recv_prev 0: nothing). */
static void recv_drop(ml_replay *r)
{
    free_named(r, r->recv_prev, r->recv_prev_name);
    r->recv_prev = 0;
    r->recv_prev_name = 0;
}

/* Block k's parameter gradients in its block-level backward: new .grad
 * tensors in the first micro-batch, else a transient added into .grad;
 * sharded (stages 2 and 3), the full gradient is a transient until its
 * reduce-scatter and the device keeps its 1/N partition. Returns that
 * transient's bytes (0 unsharded), which the caller frees. */
static uint64_t block_grads(ml_replay *r, size_t k)
{
    const ml_shard *sh = r->sh;
    const ml_cblock *b = &r->ch->blocks[k];
    uint64_t gfull = sh->grads_sharded ? b->grad_bytes : 0;
    ml__replay_alloc(r, ML_CAT_WORKSPACE, gfull);
    if (b->grads_in_fwd)
        fwd_grads_done(r, k, false);
    else if (r->micro == 0 && !r->grads_exist) /* (a view's storage: ml_cblock.grad_view) */
        ml__replay_alloc_as(r, ML_CAT_GRADS,
                            sh->grads_sharded ? ml__ep_grad_shard(r->ch, b, sh->N)
                                              : b->grad_bytes + (sh->grad_views ? b->grad_view : 0),
                            sh->grads_sharded ? ML_T_ONE
                            : sh->grad_views  ? ML_T_BLOCK_GRADS
                                              : ML_T_BLOCK_PARAMS,
                            k, 1);
    else
        ml__replay_alloc_as(r, ML_CAT_WORKSPACE, b->grad_accum_bytes, ML_T_BLOCK_PARAMS, k, 1);
    r->flops_done += b->flops_bwd; /* its backward runs */
    if (sh->grads_sharded)
        r->comm_done += ml__ep_ring(r->ch, b, sh->N, (double)b->grad_bytes, r->ch->prec.grad);
    blas_workspace(r, k, &r->blas_bwd); /* its products have run */
    return gfull;
}

/* The backward of block k: its transients, the gradients it creates, then
 * what it no longer needs. */
static void backward_block(ml_replay *r, size_t k)
{
    const ml_chain *ch = r->ch;
    const ml_shard *sh = r->sh;
    const int *seg = r->seg;
    const size_t n = ch->n;
    const ml_cblock *B = ch->blocks, *b = &B[k];
    r->block = (int32_t)k;
    uint64_t gat = gathered(r, k, true);
    ml__replay_alloc(r, ML_CAT_WORKSPACE, gat);
    gather_time(r, k);
    ml__sides_backward(r, k, true);
    if (seg[k] >= 0 && (k + 1 == n || seg[k + 1] != seg[k]))
        ml__replay_recompute_segment(r, segment_start(seg, k), k);
    if (r->selective && seg[k] < 0 && b->core_bytes)
        ml__replay_selective_core(r, k);
    /* the incoming gradient the block after handed over (a node-level
     * block's, or `hand` below) is this block's bwd_in, which ws_bwd
     * counts: the same tensor stays where it is (the loss's gradient of the
     * logits is the LM head's incoming gradient; engine.cpp passes a node's
     * output gradient on, it is not made again); a carried gradient of
     * another size is part of the estimate */
    uint64_t kept = r->grad_carry == b->bwd_in && b->ws_bwd >= b->bwd_in ? b->bwd_in : 0;
    const size_t kept_name = r->carry_name;
    if (!kept)
        free_named(r, r->grad_carry, r->carry_name);
    r->grad_carry = 0;
    r->carry_name = 0;
    /* the gradient of the block's input, the block before's incoming one:
     * a tensor of its own, handed over when the estimate holds it */
    const uint64_t hand = k > 0 && !b->in_nograd && B[k - 1].bwd_in == b->in_bytes &&
                                  b->ws_bwd - kept >= b->in_bytes
                              ? b->in_bytes
                              : 0;
    /* made last (hand_last): the units are the estimate less the last
     * one, then that one, which the handed gradient is made from */
    const uint64_t last = b->hand_last && hand && b->unit <= b->ws_bwd - kept ? b->unit : 0;
    uint64_t units = b->ws_bwd - kept - (last ? last : hand);
    const uint64_t dense = ml__tied_dense(r, b, units);
    units -= dense;
    ml__replay_alloc_as(r, ML_CAT_WORKSPACE, units, kept ? ML_T_UNITS : ML_T_UNITS_BWD, k, 1);
    const size_t units_name = named(r, units);
    recv_drop(r); /* (the incoming gradient is the units' first tensor) */
    ml__replay_alloc(r, ML_CAT_WORKSPACE, last ? last : hand);
    const size_t late_name = named(r, last ? last : hand);
    const uint64_t gfull = block_grads(r, k);
    /* the block's saved tensors are released once its gradient is done,
     * and the model's rotary tables where it released them last */
    if (seg[k] >= 0) {
        ml__replay_free(r, ML_CAT_RECOMPUTE, b->saved_bytes);
    } else {
        ml__replay_free_own_saved(r, k, b->saved_bytes - (r->selective ? b->core_bytes : 0));
        if (r->selective)
            ml__replay_free(r, ML_CAT_RECOMPUTE, b->core_bytes);
    }
    ml__replay_tables_done(r, k, false);
    /* boundary k+1: both its users are done now */
    if (k + 1 < n)
        ml__boundary_release(r, k + 1);
    /* boundary k: free unless the producer's backward still needs it */
    if (k == 0 || !(B[k - 1].out_saved))
        ml__boundary_release(r, k);
    if ((int)k == sh->side_block)
        ml__replay_free(r, ML_CAT_ACTIVATIONS, sh->side_bytes);
    ml__tied_add(r, b, dense, &units, units_name, &kept, kept_name);
    free_named(r, units, units_name);
    size_t hand_name = late_name;
    if (last) {
        ml__replay_alloc(r, ML_CAT_WORKSPACE, hand);
        hand_name = named(r, hand);
        free_named(r, last, late_name);
    }
    free_named(r, kept, kept_name);
    ml__replay_free(r, ML_CAT_WORKSPACE, gfull);
    if ((r->micro != 0 || r->grads_exist) && !b->grads_in_fwd)
        ml__replay_free(r, ML_CAT_WORKSPACE, b->grad_accum_bytes);
    ml__replay_free(r, ML_CAT_WORKSPACE, gat);
    ml__sides_backward(r, k, false);
    r->grad_carry = hand;
    r->carry_name = hand_name;
}

/* Whether block k's backward replays node by node: it has a node list and
 * keeps its gradients whole, without selective recompute; a checkpointed
 * block when every block of its segment has a node list (r->seg_nodes, set
 * at the segment's last block: docs/ledger.md, "Checkpointed segments, node
 * by node"). */
static bool by_nodes(const ml_replay *r, size_t k)
{
    const ml_cblock *b = &r->ch->blocks[k];
    if (r->selective || r->sh->grads_sharded)
        return false;
    return r->seg[k] < 0 ? b->nnodes != 0 : r->seg_nodes;
}

bool ml__segment_by_nodes(const ml_chain *ch, size_t s0, size_t k)
{
    for (size_t j = s0; j <= k; j++)
        if (!ch->blocks[j].nnodes)
            return false;
    return true;
}

/* The backward of block k node by node (docs/ledger.md, "Backward, node by
 * node"): each node allocates its input gradients and, through
 * AccumulateGrad, its parameters' gradients (new .grad tensors in the first
 * micro-batch, added in place into .grad after); then its grad_output (unless
 * a residual's buffer holds it) and the saved tensors it was the last user of
 * are freed (engine.cpp: the node's inputs are released and, without
 * retain_graph, release_variables() drops its saved tensors). */
static void backward_nodes(ml_replay *r, size_t k, size_t ran)
{
    const ml_chain *ch = r->ch;
    const ml_shard *sh = r->sh;
    const size_t n = ch->n;
    const ml_cblock *B = ch->blocks, *b = &B[k];
    r->block = (int32_t)k;
    uint64_t gat = gathered(r, k, true);
    ml__replay_alloc(r, ML_CAT_WORKSPACE, gat);
    gather_time(r, k);
    ml__sides_backward(r, k, true);
    /* the gradient of the block's output: handed over by a node-level block
     * after this one, else made by the block-level backward before it */
    if (!r->grad_carry) {
        r->grad_carry = b->bwd_in;
        ml__replay_alloc(r, ML_CAT_WORKSPACE, r->grad_carry);
        r->carry_name = named(r, r->grad_carry);
    }
    recv_drop(r);
    if (!ran) /* (else begun before the recompute, backward_step) */
        ml__nodes_begin(r);
    const bool create = r->micro == 0 && !r->grads_exist;
    ml__tied_partial(r, b, create);
    /* a checkpointed block's saved tensors are the recompute's */
    const ml_category scat = r->seg[k] >= 0 ? ML_CAT_RECOMPUTE : ML_CAT_ACTIVATIONS;
    uint64_t freed = 0;
    blas_workspace(r, k, &r->blas_bwd); /* before its nodes' first product */
    if (!ran && ml__nodes_at_once(r, k, create, scat)) {
        ml__nodeprof_apply(&r->np, r);
        freed = r->np.freed;
    } else {
        ml__nodes_one_by_one(r, k, ran, b->nnodes, create, scat, &freed);
    }
    /* time: the nodes carry no FLOPs of their own; the block's backward
     * FLOPs are counted once its nodes have run (docs/ledger.md, "Time") */
    r->flops_done += b->flops_bwd;
    fwd_grads_done(r, k, true);
    freed += scat == ML_CAT_ACTIVATIONS ? ml__replay_take_tables(r, k) : 0;
    event(r, scat, -(int64_t)(b->saved_bytes - freed));
    if (r->rsim)
        ml__rsim_free_block_saved(r->rsim, scat, k, b->saved_bytes);
    ml__replay_tables_done(r, k, true);
    if (k + 1 < n)
        ml__boundary_release(r, k + 1);
    if (k == 0 || !(B[k - 1].out_saved))
        ml__boundary_release(r, k);
    if ((int)k == sh->side_block)
        ml__replay_free(r, ML_CAT_ACTIVATIONS, sh->side_bytes);
    ml__replay_free(r, ML_CAT_WORKSPACE, gat);
    ml__sides_backward(r, k, false);
    /* the incoming buffer now holds the gradient of the block's input
     * (none when the input needs none: the model's input): the one a node
     * made for it, else the block's incoming one, which the residual sums
     * passed on to it */
    r->grad_carry = b->in_nograd ? 0 : b->in_bytes;
    ml__nodes_hand(r, b);
}

/* Block k's backward, after its segment's recompute when it ends one. */
static void backward_step(ml_replay *r, size_t k)
{
    const int *seg = r->seg;
    const size_t n = r->ch->n;
    size_t ran = 0; /* block k's nodes run before its segment's recompute */
    if (seg[k] >= 0 && (k + 1 == n || seg[k + 1] != seg[k])) {
        size_t s0 = segment_start(seg, k);
        r->seg_nodes = ml__segment_by_nodes(r->ch, s0, k);
        if (by_nodes(r, k)) {
            /* the gradient of the segment's output exists before its
             * first node unpacks a saved tensor */
            if (!r->grad_carry) {
                r->grad_carry = r->ch->blocks[k].bwd_in;
                ml__replay_alloc(r, ML_CAT_WORKSPACE, r->grad_carry);
                r->carry_name = named(r, r->grad_carry);
            }
            recv_drop(r);
            /* the nodes that unpack nothing run first (a residual sum's
             * autocast cast), the first unpack the recompute
             * (torch/utils/checkpoint.py, the non-reentrant unpack hook) */
            ran = ml__nodes_recompute(r, s0, k);
        }
    }
    if (r->ch->blocks[k].fwd_only)
        return;
    if (by_nodes(r, k))
        backward_nodes(r, k, ran);
    else
        backward_block(r, k); /* (a held gradient: within the block rule's estimate) */
    r->hold_in = false; /* the received gradient is the stage's last layer's */
}

void ml__replay_micro_batch(ml_replay *r)
{
    const size_t n = r->ch->n;
    r->sub = "";
    ml__replay_forward(r);
    r->phase = ML_PHASE_BACKWARD;
    r->block = (int32_t)(n - 1);
    ml__replay_alloc(r, ML_CAT_WORKSPACE, r->sh->reduce_ws);
    r->grad_carry = 0;
    r->carry_name = 0;
    r->tied_partial = 0;
    r->tied_name = 0;
    r->table_freed = 0;
    r->hold_in = r->ch->grad_held;
    ml_run u = {.streak = 0};
    for (size_t k = n; k-- > 0 && !r->overflow;) { /* an overflow ends the plan */
        k = ml__run_skip(&u, r, k, -1);
        if (r->overflow)
            break;
        ml__run_before(&u, r);
        backward_step(r, k);
        ml__run_after(&u, r, k, -1);
    }
    free_named(r, r->grad_carry, r->carry_name);
    r->grad_carry = 0;
    r->carry_name = 0;
    recv_drop(r); /* (a stage whose backward made no incoming gradient) */
    /* the received gradient the schedule held: dropped at the next receive */
    free_named(r, r->held_bytes, r->held_name);
    r->held_bytes = r->held_name = 0;
    r->hold_in = r->held_kept = false;
    ml__replay_free(r, ML_CAT_WORKSPACE, r->sh->reduce_ws);
    ml__output_after_backward(r);
}
