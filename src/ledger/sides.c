/* Where the tensors between and beside the blocks live: the boundary
 * tensors (docs/ledger.md, "Boundary tensors") and the side tensors
 * ("Side tensors"), made and freed under the segment plan in forward,
 * backward and a checkpoint's recompute; replay.c calls these at each
 * block. */
#include "ledger/replay.h"

/* A checkpointed block after the side tensor's maker keeps it as an input
 * until its own backward; the last of those to run backward is the first
 * of them. */
bool ml__side_end(const ml_chain *ch, const int *seg, const ml_side *s, size_t *block)
{
    *block = s->to;
    if (s->to_bwd)
        return true;
    for (size_t j = (size_t)s->from + 1; j <= s->to && s->ckpt_kept && !ch->eval_mode; j++)
        if (seg[j] >= 0) {
            *block = j;
            return true;
        }
    return false;
}

/* Side tensor i's allocation `slot` (ML_SIDE_*), of category c, and its
 * free: with the simulation, by the name it was made as. */
static void side_alloc(ml_replay *r, size_t i, unsigned slot, ml_category c, uint64_t bytes)
{
    ml__replay_alloc(r, c, bytes);
    if (r->rsim && bytes)
        ml__rsim_side_note(r->rsim, i, slot, c);
}

static void side_free(ml_replay *r, size_t i, unsigned slot, ml_category c, uint64_t bytes)
{
    const size_t name = r->rsim && bytes ? ml__rsim_side_take(r->rsim, i, slot) : 0;
    ml__replay_free_named(r, c, bytes, name);
}

/* The side tensors made by block k's forward (made: true), or freed at its
 * end (false). */
void ml__sides_forward_each(ml_replay *r, size_t k, bool made)
{
    const ml_chain *ch = r->ch;
    for (size_t i = 0; i < ch->nsides; i++) {
        const ml_side *s = &ch->sides[i];
        size_t end;
        bool bwd = ml__side_end(r->ch, r->seg, s, &end);
        ml_category c = bwd ? ML_CAT_ACTIVATIONS : ML_CAT_WORKSPACE;
        if (made && s->from == k)
            side_alloc(r, i, ML_SIDE_MADE, c, s->bytes);
        else if (!made && !bwd && end == k)
            side_free(r, i, ML_SIDE_MADE, c, s->bytes);
    }
}

/* The side tensors' gradients block k's backward starts (start: true),
 * and at its end those gradients and the side tensors that go. */
void ml__sides_backward_each(ml_replay *r, size_t k, bool start)
{
    const ml_chain *ch = r->ch;
    for (size_t i = 0; i < ch->nsides; i++) {
        const ml_side *s = &ch->sides[i];
        size_t end;
        if (start && s->grad_from == k)
            side_alloc(r, i, ML_SIDE_GRAD, ML_CAT_WORKSPACE, s->grad);
        if (!start && s->grad_to == k)
            side_free(r, i, ML_SIDE_GRAD, ML_CAT_WORKSPACE, s->grad);
        if (!start && ml__side_end(r->ch, r->seg, s, &end) && end == k)
            side_free(r, i, ML_SIDE_MADE, ML_CAT_ACTIVATIONS, s->bytes);
    }
}

/* A recompute of blocks s0..k makes again the side tensors those blocks
 * make (T5's first blocks compute their position biases inside the
 * checkpoint): workspace from block j's recompute (made: true) to the
 * segment's end (made: false, j = k), when the recomputed outputs go. */
void ml__sides_recompute_each(ml_replay *r, size_t s0, size_t j, bool made)
{
    const ml_chain *ch = r->ch;
    for (size_t i = 0; i < ch->nsides; i++) {
        const ml_side *s = &ch->sides[i];
        if (made && s->from == j)
            side_alloc(r, i, ML_SIDE_RECOMPUTED, ML_CAT_WORKSPACE, s->bytes);
        else if (!made && s->from >= s0 && s->from <= j)
            side_free(r, i, ML_SIDE_RECOMPUTED, ML_CAT_WORKSPACE, s->bytes);
    }
}

/* A multimodal model's training.vision_tower over the plan seg[]: the
 * tower's layers (checkpoint indices below mask_ckpt0) in no segment
 * (none) or each in its own (full). */
void ml__eval_stack_segments(const ml_chain *ch, int *seg)
{
    if (ch->vis_mode != ML_VT_NONE && ch->vis_mode != ML_VT_FULL)
        return;
    for (size_t k = 0; k < ch->n; k++) {
        int c = ch->blocks[k].ckpt_index;
        if (c >= 0 && (uint64_t)c < ch->mask_ckpt0)
            seg[k] = ch->vis_mode == ML_VT_FULL ? c : -1;
    }
}

/* Where each boundary tensor lives under the plan (docs/ledger.md,
 * "boundary tensors"). */
void ml__eval_boundaries(const ml_chain *ch, const int *seg, bool held, ml_boundary *bd)
{
    for (size_t k = 0; k < ch->n; k++) {
        const ml_cblock *b = &ch->blocks[k];
        bool prod = k > 0 && ch->blocks[k - 1].out_saved && seg[k - 1] < 0;
        bool cons = b->in_saved && seg[k] < 0;
        bool start = seg[k] >= 0 && (k == 0 || seg[k - 1] != seg[k]);
        bd[k].kept = prod || cons || start || (held && b->in_held);
        bd[k].cat = (prod || cons || start) ? ML_CAT_ACTIVATIONS : ML_CAT_WORKSPACE;
        bd[k].by_consumer = !prod && (cons || start);
        /* (an unused vision layer's output: its input, aliased or kept) */
        bd[k].alias = k > 0 && ch->blocks[k - 1].identity &&
                      (bd[k - 1].kept || (ch->blocks[k - 1].unused_out && bd[k - 1].alias));
    }
}

/* Allocates boundary k (block k's input) as its producer writes it. */
void ml__boundary_alloc(ml_replay *r, size_t k, uint64_t bytes)
{
    r->held_cat[k] = r->bd[k].kept ? r->bd[k].cat : ML_CAT_WORKSPACE;
    r->held[k] = bytes;
    ml__replay_alloc(r, r->held_cat[k], bytes);
    if (r->ch->blocks[k].in_held)
        r->out_name = bytes && r->rsim ? ml__rsim_latest(r->rsim, r->held_cat[k]) : 0;
}

/* Frees boundary k, by the simulation's name where it is the model output. */
static void free_boundary(ml_replay *r, size_t k)
{
    if (r->ch->blocks[k].in_held) {
        ml__replay_free_named(r, r->held_cat[k], r->held[k], r->out_name);
        r->out_name = 0;
    } else {
        ml__replay_free(r, r->held_cat[k], r->held[k]);
    }
    r->held[k] = 0;
}

/* Frees `bytes` of the output's key/value cache block by block, as
 * forward_block made it (a free of the sum would release whatever
 * workspace tensor was latest), each by its simulated name: this
 * micro-batch's or (prev) the previous one's. */
void ml__out_cache_free(ml_replay *r, uint64_t bytes, bool prev)
{
    for (size_t k = 0; k < r->ch->n && bytes; k++) {
        const uint64_t b = r->ch->blocks[k].out_cache_bytes;
        if (b && b <= bytes) {
            const size_t name = r->rsim ? ml__rsim_cache_take(r->rsim, k, prev) : 0;
            ml__replay_free_named(r, ML_CAT_WORKSPACE, b, name);
            bytes -= b;
        }
    }
    if (bytes) /* (more than one micro-batch's: the rest by its sum) */
        ml__replay_free(r, ML_CAT_WORKSPACE, bytes);
}

void ml__replay_drop_prev(ml_replay *r)
{
    if (r->prev_out)
        ml__replay_free_named(r, r->prev_out_cat, r->prev_out, r->prev_out_name);
    if (r->prev_cache)
        ml__out_cache_free(r, r->prev_cache, true);
    r->prev_out = r->prev_cache = 0;
    r->prev_out_name = 0;
}

void ml__output_after_backward(ml_replay *r)
{
    for (size_t k = 0; k < r->ch->n && r->keep_output; k++)
        if (r->ch->blocks[k].in_held && r->held[k] && r->drop_output) {
            free_boundary(r, k);
        } else if (r->ch->blocks[k].in_held && r->held[k]) {
            r->prev_out = r->held[k];
            r->prev_out_cat = r->held_cat[k];
            r->prev_out_name = r->out_name;
            r->held[k] = 0;
            r->out_name = 0;
        }
    if (r->keep_output && r->cache_out) { /* the output's cache goes with it */
        if (r->drop_output) {
            ml__out_cache_free(r, r->cache_out, false);
        } else {
            r->prev_cache += r->cache_out;
            if (r->rsim)
                ml__rsim_cache_age(r->rsim);
        }
        r->cache_out = 0;
    }
}

/* Frees boundary k and the recompute's copy of it, if still allocated; the
 * model output the loop holds (logits: kept) stays. */
void ml__boundary_release(ml_replay *r, size_t k)
{
    if (r->recomputed[k]) {
        ml__replay_free(r, ML_CAT_RECOMPUTE, r->recomputed[k]);
        r->recomputed[k] = 0;
    }
    if (r->keep_output && r->ch->blocks[k].in_held)
        return;
    if (r->held[k])
        free_boundary(r, k);
}

/* Block k's forward has consumed its input: freed unless something keeps
 * it (once: held[k] is 0 after). */
void ml__boundary_input_done(ml_replay *r, size_t k)
{
    if (r->bd[k].kept)
        return;
    free_boundary(r, k);
}

/* The LM head's partial gradient of a tied table: it waits in the
 * engine's buffer until the embedding's arrives (input_buffer.cpp); made by
 * the head's node whose parameter gradient is the table's, where the chain
 * has the embedding (block 0). */
void ml__tied_partial(ml_replay *r, const ml_cblock *b, bool create)
{
    /* (a pipeline stage without the embedding: the head's is its own) */
    const ml_cblock *e = &r->ch->blocks[0];
    if (!b->tied_grad || b->in_nograd || !e->in_nograd || e->tied_grad != b->tied_grad)
        return;
    r->tied_partial = 0;
    r->tied_name = 0;
    r->tied_cat = create ? ML_CAT_GRADS : ML_CAT_WORKSPACE;
    /* (fused cross-entropy: the table's gradient its forward made, which
     * its backward returns, is the partial) */
    if (b->grads_in_fwd)
        r->tied_partial = b->tied_grad;
    for (size_t j = 0; j < b->nnodes && !r->tied_partial; j++)
        if (r->ch->nodes[b->node_first + j].param_grad == b->tied_grad)
            r->tied_partial = b->tied_grad;
}

/* A tied table's gradient at the embedding's backward: the LM head's
 * partial waited in the engine's buffer, the embedding's dense one (in its
 * transients) arrives, and the buffer adds the two into a new tensor
 * (input_buffer.cpp, accumulate: old_var + var, the partial being no
 * tensor it adds into in place), dropping the partial. In the first
 * micro-batch AccumulateGrad makes the sum the .grad; in a later one the
 * sum is the block's transient gradient (grad_accum_bytes, which counts
 * the table's), added into .grad in place (accumulate_grad.h) and freed
 * with the block. The dense one goes with the transients (docs/ledger.md,
 * "Transients"). */
void ml__tied_sum(ml_replay *r, const ml_cblock *b)
{
    if (!r->tied_partial || !b->in_nograd || b->tied_grad != r->tied_partial)
        return;
    const uint64_t g = r->tied_partial;
    const ml_category c = r->tied_cat;
    if (c == ML_CAT_GRADS)
        ml__replay_alloc(r, c, g);
    ml__replay_free_named(r, c, g, r->tied_name);
    r->tied_partial = 0;
    r->tied_name = 0;
}

void ml__side_kept(ml_replay *r, uint64_t mask)
{
    const uint64_t side = r->sh->side_bytes;
    if (!mask || mask != side || side > (uint64_t)INT64_MAX) {
        ml__replay_free(r, ML_CAT_WORKSPACE, mask);
        ml__replay_alloc_as(r, ML_CAT_ACTIVATIONS, side, ML_T_SIDE, 0, 1);
        return;
    }
    ml__replay_ledger_event(r, ML_CAT_WORKSPACE, -(int64_t)mask);
    ml__replay_ledger_event(r, ML_CAT_ACTIVATIONS, (int64_t)mask);
    if (r->rsim)
        ml__rsim_move(r->rsim, ML_CAT_WORKSPACE, ML_CAT_ACTIVATIONS, mask);
}

/* A tied table's embedding block b: its dense (V, D) gradient
 * (embedding_dense_backward's zeros), made now apart from the rest of the
 * estimate (units: the incoming gradient, the kernel's scratch), which is
 * gone before the input buffer adds the head's partial to it (engine.cpp,
 * evaluate_function: call_function, release_variables, then
 * input_buffer.add; the allocator simulation splits it so already).
 * Returns its bytes, 0 for any other block. */
uint64_t ml__tied_dense(ml_replay *r, const ml_cblock *b, uint64_t units)
{
    const uint64_t d = r->tied_partial && b->in_nograd && b->tied_grad == r->tied_partial &&
                               units >= b->tied_grad && !r->rsim
                           ? b->tied_grad
                           : 0;
    ml__replay_alloc(r, ML_CAT_WORKSPACE, d);
    return d;
}

/* The input buffer's sum of the tied table's gradients (ml__tied_sum);
 * after the dense gradient's node (dense), its inputs and scratch (*units,
 * *kept, named so) first go, and the dense gradient after the sum. */
void ml__tied_add(ml_replay *r, const ml_cblock *b, uint64_t dense, uint64_t *units,
                     size_t units_name, uint64_t *kept, size_t kept_name)
{
    if (dense) {
        ml__replay_free_named(r, ML_CAT_WORKSPACE, *units, units_name);
        ml__replay_free_named(r, ML_CAT_WORKSPACE, *kept, kept_name);
        *units = *kept = 0;
    }
    ml__tied_sum(r, b);
    ml__replay_free(r, ML_CAT_WORKSPACE, dense);
}
