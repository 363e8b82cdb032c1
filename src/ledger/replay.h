/* The replay engine (replay.c) and what the plan entry point (evaluate.c)
 * and the optimal planner (optimal_plan.c) share. Internal to src/ledger/.
 * The rules: docs/ledger.md. */
#ifndef ML_REPLAY_H
#define ML_REPLAY_H

#include <string.h>

#include "ledger/chain.h"
#include "ledger/reserved.h"
#include "ledger/reserved_memo.h"
#include "ledger/shard.h"
#include "util/text.h"

struct ml_ledger {
    ml_summary sum;
    ml_block_info *blocks;   /* after the ledger, in its allocation (evaluate.c) */
    size_t nblocks;
    ml_event *events;
    size_t nevents, cap;
    struct ml_level *levels; /* the events as levels (levels.h), or NULL */
    size_t nlevels;
    uint64_t skipped;        /* blocks its replays moved over (replay_runs.c) */
    ml_rank_info *ranks;     /* pipeline stages (pipeline_eval.c), or NULL */
    size_t nranks, worst_rank;
    ml_sim_event *aev;     /* the simulation's events (keep_events), or NULL */
    size_t naev;
    size_t step_done; /* the step's first event after its compute (SIZE_MAX: none yet) */
};

/* The rules of docs/ledger.md, "boundary tensors": boundary k is block k's
 * input (block k-1's output). */
typedef struct {
    bool alias;     /* the same storage as the previous boundary, which is kept */
    bool kept;      /* resident after its consumer's forward */
    ml_category cat;
    bool by_consumer; /* attributed to the consumer block */
} ml_boundary;

/* A block's backward node list as one step (replay_nodes.c): its changes
 * per category, and the prefix maxima and minima over its events, from a
 * level of zero; made from the list of block `block` with its gradients
 * created or added (create) and its saved tensors in category scat. */
typedef struct {
    int64_t D[ML_CAT_COUNT], Dt;              /* the changes */
    int64_t Mt, at_max[ML_CAT_COUNT];         /* the highest total after an
                                                 allocation, the first, and the
                                                 levels there */
    int64_t Mc[ML_CAT_COUNT];                 /* each category's highest after
                                                 one of its allocations */
    int64_t minc[ML_CAT_COUNT], mint;         /* the lowest levels (frees) */
    uint64_t freed;                           /* saved bytes the nodes free */
    bool nz, has_alloc, cat_alloc[ML_CAT_COUNT];
    bool valid, create;
    ml_category scat;
    size_t block;
} ml_nodeprof;

/* One replay: the live bytes per category and the events it writes into
 * the ledger, walking the chain under a segment plan (seg[k]: the
 * checkpoint segment of block k, -1 when not checkpointed). */
typedef struct {
    ml_ledger *l;
    const ml_chain *ch;
    const ml_shard *sh;
    const int *seg;
    const ml_boundary *bd;
    bool selective;          /* checkpoint: selective (the attention core) */
    bool keep_output;        /* logits: kept — the loop holds the model output */
    bool drop_output;        /* logits: through-backward — and drops it once the
                                micro-batch's backward ends */
    bool grads_exist;        /* zero_grad: zero — every .grad stays allocated, so
                                backward accumulates into it in place */
    bool hold_cache;         /* evaluation: the output holds each layer's keys and
                                values (cache_bytes) */
    bool train_cache;        /* training with HF use_cache: the output holds the
                                cache's copies no op saves (out_cache_bytes) */
    uint64_t cache_out;      /* ... this micro-batch's, allocated so far */
    uint64_t prev_cache;     /* ... a previous micro-batch's, freed with prev_out */
    /* the cuBLAS workspaces the simulation still has to make: the forward
     * thread's at its first product, the backward thread's at its first
     * (ml_device.blas_workspace; a process's first iteration only) */
    uint64_t blas_fwd, blas_bwd;
    uint64_t table_freed; /* rotary tables freed from table_block's saved */
    size_t table_block;
    /* per boundary k, n + 1 entries each */
    uint64_t *held;          /* bytes of boundary k still allocated, 0 once freed */
    ml_category *held_cat;   /* the category boundary k is counted in */
    uint64_t *recomputed;    /* bytes of boundary k's copy made by a recompute */
    /* the model output a previous micro-batch's loop still holds (logits:
     * kept), freed once this micro-batch's loss is computed */
    uint64_t prev_out;
    ml_category prev_out_cat;
    size_t out_name, prev_out_name; /* this one's and prev_out's simulated names */
    /* results of a micro-batch */
    double flops_recompute;  /* recompute FLOPs of this micro-batch */
    double flops_done;       /* FLOPs of the iteration run so far (events' time) */
    double comm_done;        /* bytes sent over the interconnect so far */
    double host_done;        /* bytes moved over the host link so far */
    uint64_t act_end;        /* activations live at the end of forward */
    uint64_t peak_first;     /* the first iteration's peak: optimizer states exist
                                only from the first step() on */
    /* running state */
    uint64_t live[ML_CAT_COUNT];
    uint64_t total;
    ml_phase phase;
    int32_t block;
    uint32_t micro;
    uint64_t grad_carry;     /* the gradient a block's backward hands to the
                                block before it (its input's), 0 if none */
    size_t carry_name;       /* its allocation in the simulation when a
                                block-level backward made it (ml__rsim_latest),
                                0: freed by its bytes */
    uint64_t tied_partial;   /* a tied table's gradient from the LM head's
                                node, waiting in the engine's buffer for the
                                embedding's (first micro-batch), 0: none */
    size_t tied_name;        /* its allocation in the simulation (0: none) */
    ml_category tied_cat;    /* its category: GRADS in the first micro-batch,
                                WORKSPACE in a later one (added into .grad) */
    bool seg_nodes;          /* the checkpoint segment being replayed backward
                                runs node by node (every block has a node list) */
    const char *sub; /* "" or " (recompute)" */
    const char *peak_sub;
    /* sub at each phase's steady and first-iteration peak (ml_phase_peak) */
    const char *phase_sub[ML_PHASE_COUNT], *first_sub[ML_PHASE_COUNT];
    /* the level an event starts from was recorded as a point of phase
     * pointed_phase (replay.c's event): within a phase it is the level the
     * last event left, recorded then or lower; false after a run moved the
     * levels (replay_runs.c) */
    bool pointed;
    ml_phase pointed_phase;
    bool keep, nomem, overflow, underflow;
    bool whole;              /* every block replayed, no run moved over */
    const unsigned char *runs; /* per block, ML_RUN_* (ml__run_flags), or NULL:
                                  then replay_runs.c asks the chain each time */
    ml_rsim *rsim;           /* the allocator simulation, or NULL */
    /* the recompute FLOPs added so far and the last addition (a run of
     * identical blocks repeats a block's additions: replay_runs.c) */
    unsigned rec_adds;
    double rec_last;
    ml_nodeprof np;          /* the last node list made into one step */
    /* with rsim, a node-level backward's gradients by tensor (ml_bnode's
     * gin_id): the allocation of each one's gradient, the one an
     * accumulation node is about to free, their bytes (0: none); the
     * block's incoming gradient's allocation and bytes */
    size_t gname[ML_GID_NONE + 1], gpend[ML_GID_NONE + 1];
    uint64_t gbytes[ML_GID_NONE + 1], gpbytes[ML_GID_NONE + 1];
    size_t gcarry, gcarry_old; /* (the old sum an out-of-place accumulation left) */
    uint64_t gcarry_bytes;
    /* the received gradient a pipeline stage's schedule holds (ml_chain.
     * grad_held): hold_in before the first sum into it (replay_nodes.c,
     * held_sum), then held_bytes (held_name) to the micro-batch's end */
    bool hold_in, held_kept;
    uint64_t held_bytes;
    size_t held_name;
    /* ml_inflight.recv, to this micro-batch's own receive (recv_drop) */
    uint64_t recv_prev;
    size_t recv_prev_name;
    /* with rsim, where its reserved bytes peaked (ml__replay_reserved_point);
     * last, so that the fields every event reads stay together */
    struct {
        uint64_t top, allocated, segments;
        ml_phase phase;
        int32_t block;
        const char *sub;
        ml_reserved_when when, now;
    } rsv;
} ml_replay;

/* Runs of identical layers (replay_runs.c; docs/ledger.md, "Runs of
 * identical layers"): a layer whose replay is the one before it moved by a
 * constant. The replay runs the first two of a run and its last, and moves
 * the live bytes over the ones between; no peak can lie between (each
 * level there is between the two ends' levels at the same event). */
typedef struct {
    uint64_t before[ML_CAT_COUNT + 1]; /* live bytes and total before the block */
    uint64_t delta[ML_CAT_COUNT + 1];  /* the last block's change, mod 2^64 */
    double fdone[3];                   /* flops, comm and host done before it */
    double fdelta[3];
    unsigned adds0, adds;              /* recompute additions before it, in it */
    uint64_t cache0, dcache;           /* the output's cache before it, its change */
    double rec;                        /* its last recompute addition */
    size_t last;                       /* the block measured last */
    unsigned streak;                   /* blocks in a row with equal changes */
} ml_run;

void ml__run_before(ml_run *u, const ml_replay *r);
/* After block k (the one before it in the walk's direction: k - dir). */
void ml__run_after(ml_run *u, const ml_replay *r, size_t k, int dir);
/* The blocks from k on (dir +1) or down (dir -1) that need no replay: their
 * live bytes, FLOPs and boundaries moved as the run's; returns the block to
 * replay next (k when none is skipped). */
size_t ml__run_skip(ml_run *u, ml_replay *r, size_t k, int dir);

/* Which blocks of r's chain continue a run under r's segment plan and
 * boundaries, into flags (n + 1 entries), once per replay setup: block i
 * in a run (ML_RUN_IN), and its output boundary as its input's too
 * (ML_RUN_ON). */
enum { ML_RUN_IN = 1, ML_RUN_ON = 2 };
void ml__run_flags(const ml_replay *r, unsigned char *flags);

/* Where side tensor s is freed under the segment plan seg (docs/ledger.md,
 * "Side tensors"): true, after the backward of *block; false, after its
 * forward. */
bool ml__side_end(const ml_chain *ch, const int *seg, const ml_side *s, size_t *block);
/* Boundary k (block k's input) allocated as its producer writes it; freed
 * with the recompute's copy of it, if still allocated (the model output the
 * loop holds, logits: kept, stays); freed once block k's forward has
 * consumed it unless something keeps it (sides.c). */
void ml__boundary_alloc(ml_replay *r, size_t k, uint64_t bytes);
void ml__boundary_release(ml_replay *r, size_t k);
/* A tied table's gradient (sides.c): the LM head's partial, left in the
 * engine's buffer by head block b's nodes (create: the first micro-batch's
 * .grad to be); and at the embedding's block b the buffer's sum of it and
 * the embedding's own, then the partial freed: the sum made the .grad, or
 * in a later micro-batch added into it and freed. */
void ml__tied_partial(ml_replay *r, const ml_cblock *b, bool create);
void ml__tied_sum(ml_replay *r, const ml_cblock *b);
/* In the embedding's block-level backward (sides.c): its dense gradient
 * made apart from the estimate's units (ml__tied_dense, its bytes, 0 for
 * any other block), then the buffer's sum after the units and kept
 * tensors go (ml__tied_add). */
uint64_t ml__tied_dense(ml_replay *r, const ml_cblock *b, uint64_t units);
void ml__tied_add(ml_replay *r, const ml_cblock *b, uint64_t dense, uint64_t *units,
                  size_t units_name, uint64_t *kept, size_t kept_name);
void ml__boundary_input_done(ml_replay *r, size_t k);
/* The first checkpointed block: what a checkpoint keeps for the backward
 * (sh->side_bytes) counts as an activation from here; the mask the
 * model's forward made (mask bytes) is that same tensor when the sizes
 * agree, else it goes and the kept tensors are made. */
void ml__side_kept(ml_replay *r, uint64_t mask);
/* The side tensors block k's forward makes (made: true) or frees at its
 * end (false); those its backward's start makes (the gradients) or its
 * end frees; those a recompute of s0..j makes again (made) or frees at the
 * segment's end (j its last block) (sides.c). */
void ml__sides_forward_each(ml_replay *r, size_t k, bool made);
void ml__sides_backward_each(ml_replay *r, size_t k, bool start);
void ml__sides_recompute_each(ml_replay *r, size_t s0, size_t j, bool made);
/* (inline: most chains have no side tensors, and the replay asks at every
 * block) */
static inline void ml__sides_forward(ml_replay *r, size_t k, bool made)
{
    if (r->ch->nsides)
        ml__sides_forward_each(r, k, made);
}
static inline void ml__sides_backward(ml_replay *r, size_t k, bool start)
{
    if (r->ch->nsides)
        ml__sides_backward_each(r, k, start);
}
static inline void ml__sides_recompute(ml_replay *r, size_t s0, size_t j, bool made)
{
    if (r->ch->nsides)
        ml__sides_recompute_each(r, s0, j, made);
}

static inline void ml__phase_max(ml_phase_peak *p, uint64_t v, int32_t block, const char **sub_at,
                                 const char *sub)
{
    if (p->present && v <= p->peak)
        return;
    p->present = true;
    p->peak = v;
    p->block = block;
    *sub_at = sub;
}

/* The live bytes now as a point of the current phase's steady peak and,
 * first (the bytes the first iteration would hold), its first-iteration
 * peak (event() in replay.c calls it at each allocation: inline). */
static inline void ml__replay_phase_point_at(ml_replay *r, uint64_t total, uint64_t first)
{
    ml_summary *s = &r->l->sum;
    ml__phase_max(&s->phase_steady[r->phase], total, r->block, &r->phase_sub[r->phase], r->sub);
    ml__phase_max(&s->phase_first[r->phase], first, r->block, &r->first_sub[r->phase], r->sub);
}

static inline void ml__replay_phase_point(ml_replay *r, uint64_t first)
{
    ml__replay_phase_point_at(r, r->total, first);
}

/* The node list nd (nnodes nodes, saved list sv) into *p; whether p's
 * checks hold from r's levels (else the events run one by one); p applied
 * to r (replay_nodes.c). */
void ml__nodeprof_make(ml_nodeprof *p, const ml_bnode *nd, size_t nnodes, const ml_saved *sv,
                       bool create, ml_category scat);
bool ml__nodeprof_fits(const ml_nodeprof *p, const ml_replay *r);
void ml__nodeprof_apply(const ml_nodeprof *p, ml_replay *r);
/* Block k's nodes from..to-1 event by event, *freed adding the saved bytes
 * they free (the simulation frees each saved tensor as its node does);
 * whether the whole list runs as one step instead (r->np made or kept). */
void ml__nodes_one_by_one(ml_replay *r, size_t k, size_t from, size_t to, bool create,
                          ml_category scat, uint64_t *freed);
bool ml__nodes_at_once(ml_replay *r, size_t k, bool create, ml_category scat);
/* The rotary tables block k's nodes release (ml_bnode.frees_table), or at
 * its backward's end those they did not; k's own saved tensors less the
 * tables freed; those bytes, taken (replay_nodes.c). */
void ml__replay_free_tables(ml_replay *r, size_t k, unsigned bits);
void ml__replay_tables_done(ml_replay *r, size_t k, bool at_nodes);
void ml__replay_free_own_saved(ml_replay *r, size_t k, uint64_t own);
uint64_t ml__replay_take_tables(ml_replay *r, size_t k);
/* Segment s0..k recomputed after k's first nodes that unpack nothing
 * (ml_bnode.unpacks; non-reentrant checkpointing recomputes at the first
 * unpack), their names kept across it: returns how many ran. */
size_t ml__nodes_recompute(ml_replay *r, size_t s0, size_t k);
/* Whether blocks s0 to k (a checkpoint segment) each have a node list:
 * then the segment's backward replays node by node (replay.c). */
bool ml__segment_by_nodes(const ml_chain *ch, size_t s0, size_t k);
/* The recomputes before block k's backward (replay_recompute.c): the
 * checkpointed segment s0..k's forward again, block by block or (its
 * blocks' node lists) node by node; selective recompute's attention core
 * of block k. */
void ml__replay_recompute_nodes(ml_replay *r, size_t s0, size_t k);
void ml__replay_recompute_segment(ml_replay *r, size_t s0, size_t k);
void ml__replay_selective_core(ml_replay *r, size_t k);
/* With rsim, one tensor of b bytes of category c in the simulation alone
 * (the ledger told apart): its name (ml__rsim_latest). */
size_t ml__replay_sim_tensor(ml_replay *r, ml_category c, uint64_t b);
/* A change of the ledger's level alone (the simulation told apart). */
void ml__replay_ledger_event(ml_replay *r, ml_category c, int64_t delta);
/* Frees b bytes of category c the simulation made as `name` (0, or no
 * simulation: as ml__replay_free; a name no longer live: by size, counted
 * inexact). */
void ml__replay_free_named(ml_replay *r, ml_category c, uint64_t b, size_t name);

/* At a phase's first event, the level the phase was entered at as a point
 * of its peaks (later in the phase it is the level the last event left:
 * recorded by that event, or below a level it recorded, so a point would
 * change nothing). */
static inline void ml__replay_enter(ml_replay *r)
{
    if (r->pointed && r->pointed_phase == r->phase)
        return;
    ml__replay_phase_point(r, r->phase == ML_PHASE_OPTIMIZER
                                 ? r->total
                                 : r->total - r->live[ML_CAT_OPTIMIZER]);
    r->pointed = true;
    r->pointed_phase = r->phase;
}

/* After an allocation, the level total with the categories at live: a
 * point of the first iteration's peak (the same events without the
 * optimizer states before the step creates them), of the phases' peaks and
 * of the peak, whose breakdown is live. */
static inline void ml__replay_rise(ml_replay *r, uint64_t total, const uint64_t *live)
{
    ml_summary *s = &r->l->sum;
    uint64_t first = r->phase == ML_PHASE_OPTIMIZER ? total : total - live[ML_CAT_OPTIMIZER];
    if (first > r->peak_first)
        r->peak_first = first;
    ml__replay_phase_point_at(r, total, first);
    if (total > s->peak) {
        s->peak = total;
        s->peak_phase = r->phase;
        s->peak_block = r->block;
        r->peak_sub = r->sub; /* peak_step is written once, at the end */
        memcpy(s->peak_breakdown, live, sizeof s->peak_breakdown);
    }
}

/* Writes the `at` names of s's phase_steady and phase_first from the
 * blocks and subs r recorded. */
void ml__replay_phase_names(const ml_replay *r, ml_summary *s);
/* After an allocation in r->rsim: where its reserved bytes peaked, when
 * they pass the highest so far (r->rsv). */
void ml__replay_reserved_point(ml_replay *r);
/* An allocation of b bytes in category c, telling the allocator
 * simulation which tensors make up b; a free. Out of line where there is
 * something to count: an allocation or a free of nothing is no event, and
 * without a simulation nothing at all (a replay's calls are many, a third
 * of them of nothing). */
void ml__replay_alloc_event(ml_replay *r, ml_category c, uint64_t b, ml_tensor_split split,
                            size_t block, unsigned copies);
void ml__replay_free_event(ml_replay *r, ml_category c, uint64_t b);
/* With rsim, node x's input gradients: one event of grad_in, each tensor
 * of x->gin_id its own allocation in the simulation, once the
 * allocations its grad_out parts name are taken into taken[0 .. 3); its
 * grad_out: one event, each of those freed (else by bytes). */
void ml__replay_node_grads_in(ml_replay *r, const ml_bnode *x, size_t *taken);
void ml__replay_node_grads_out(ml_replay *r, const ml_bnode *x, const size_t *taken);
/* A node-level block's backward begins, r->grad_carry (carry_name) its
 * incoming gradient: with rsim, no gradient of its own named yet, the
 * incoming one the one its residual sums pass on (r->gcarry). It ends
 * (block b, r->grad_carry its input's gradient): with rsim, carry_name
 * the allocation b hands on (ml_cblock.hand_gid, else the incoming one). */
/* Block k's forward, with grad or without, where the simulation knows it
 * op by op (b->ngsteps, not under selective checkpointing; b->nfsteps):
 * the ledger's transient (ws_fwd, ws_nograd) and with grad its saved
 * tensors (category c) as figures, the simulation's steps before the
 * output, each saved tensor filling the block's saved allocation as its op
 * runs. False, and nothing done, where it is not known so: the caller
 * allocates the aggregates (replay_fsteps.c). */
bool ml__replay_steps_begin(ml_replay *r, size_t k, bool grad, ml_category c);
/* Once the output is made: the transient's end, and where the steps were
 * made (what ml__replay_steps_begin returned) the steps after the output. */
void ml__replay_steps_end(ml_replay *r, size_t k, bool grad, ml_category c, bool made);
void ml__nodes_begin(ml_replay *r);
void ml__nodes_hand(ml_replay *r, const ml_cblock *b);
static inline void ml__replay_alloc_as(ml_replay *r, ml_category c, uint64_t b,
                                       ml_tensor_split split, size_t block, unsigned copies)
{
    if (b || r->rsim)
        ml__replay_alloc_event(r, c, b, split, block, copies);
}
static inline void ml__replay_alloc(ml_replay *r, ml_category c, uint64_t b)
{
    ml__replay_alloc_as(r, c, b, ML_T_ONE, 0, 1);
}
static inline void ml__replay_free(ml_replay *r, ml_category c, uint64_t b)
{
    if (b || r->rsim)
        ml__replay_free_event(r, c, b);
}
/* A recompute's FLOPs added to this micro-batch's. */
void ml__replay_recompute_flops(ml_replay *r, double f);
/* The forward of one micro-batch; blocks with seg[k] >= 0 run under
 * no_grad (nothing saved). */
void ml__replay_forward(ml_replay *r);
/* The output the loop holds (logits: kept; sides.c), freed by its name: a
 * previous micro-batch's dropped, its cache with it, at this one's loss or
 * after the step; after a backward, this one's kept as the previous
 * (through-backward: dropped); `bytes` of the output's cache freed. */
void ml__replay_drop_prev(ml_replay *r);
void ml__output_after_backward(ml_replay *r);
void ml__out_cache_free(ml_replay *r, uint64_t bytes, bool prev);
/* Forward and backward of one micro-batch (r->micro: its index). */
void ml__replay_micro_batch(ml_replay *r);

/* A pipeline stage: the other micro-batches' activations it holds while
 * one runs, at the step's first micro-batch (no gradients yet) and at a
 * later one, a later one's earlier input gradient still referenced, and
 * the earlier output gradient it received, held through a later one's
 * forward to the next receive (pipeline_eval.c). All 0: not a stage. */
typedef struct {
    uint64_t first, later, stale, recv;
} ml_inflight;
/* One micro-batch (later: not the step's first) beside what `in` holds. */
void ml__replay_stage_micro_batch(ml_replay *r, const ml_inflight *in, bool later);

/* What one evaluation needs besides the segment plan. */
typedef struct {
    const ml_chain *ch;
    const ml_config *cfg;
    ml_optim_bytes ob;
    /* scratch, n + 1 entries each */
    ml_boundary *bd;
    uint64_t *recomputed, *held;
    ml_category *held_cat;
    unsigned char *runs;
    int side_block; /* set by ml__eval_run */
    uint64_t cache_allow; /* bytes the verdict adds to an unsimulated allocator
                             peak: the cache a simulation found over the last
                             optimal plan, while checkpoint optimal searches
                             again with it (evaluate.c) */
    uint64_t start_held; /* with checkpoint optimal, what the process holds
                            before the plan (ml__rsim_process_held: a start
                            state's live blocks, else the cuBLAS workspaces):
                            its search counts it beside every plan's peak */
    bool whole;     /* replay every block (the reference tests/unit/test_runs.c
                       holds the runs against) */
    ml_inflight inflight; /* a pipeline stage's (pipeline_eval.c) */
    bool activations_only; /* a stage's first pass, for one micro-batch's
                              activations: the replay to the end of its
                              forward; no evaluation pass, step time or
                              allocator simulation (not with checkpoint
                              optimal, whose choice rests on them) */
    ml_reserved_memo *memo; /* the simulations already run (NULL: none kept) */
    ml_ledger *aev_to;      /* a ledger the simulation records its events
                               into (keep_events), or NULL */
    /* the evaluation pass, planned once (it does not depend on the
     * checkpoint plan): ml__eval_pass */
    bool has_eval;
    uint64_t eval_peak;
    ml_phase_peak eval_phases[ML_PHASE_COUNT]; /* its phases' peaks */
} ml_evalctx;

/* The evaluation pass (training.eval_batch): the resident model states and
 * one forward under no_grad at the evaluation shape, the loop holding the
 * model output. Sets x->has_eval and x->eval_peak. */
ml_status ml__eval_pass(const ml_model *m, ml_evalctx *x, ml_error *err);
/* One iteration's plan over a chain already built for cfg (evaluate.c):
 * what ml_ledger_evaluate does once it has the chain, which stays the
 * caller's; its allocator simulation looked up in, and added to, *memo
 * (NULL: none kept). */
ml_status ml__evaluate_chain(const ml_model *m, const ml_config *cfg, const ml_chain *chain,
                             bool keep_events, bool whole, ml_reserved_memo *memo,
                             ml_ledger **out, ml_error *err);
/* The same for one chain as it stands, with a pipeline stage's in-flight
 * bytes held while its micro-batches run (NULL: none). */
ml_status ml__evaluate_stage(const ml_model *m, const ml_config *cfg, const ml_chain *chain,
                             bool keep_events, bool whole, ml_reserved_memo *memo,
                             const ml_inflight *inflight, ml_ledger **out, ml_error *err);
/* One micro-batch's activations at the end of the chain's forward, as
 * ml__evaluate_stage without in-flight bytes plans them (the figure a
 * pipeline stage's in-flight ones are made of), without what does not
 * change them: the rest of the iteration, the evaluation pass, the step
 * time and the allocator simulation (all of it under checkpoint optimal,
 * whose segments depend on them). */
ml_status ml__stage_activations(const ml_model *m, const ml_config *cfg, const ml_chain *chain,
                                bool whole, uint64_t *bytes, ml_error *err);
/* Pipeline parallelism (pipeline_eval.c): every stage of the chain planned
 * (no simulation memo: the stages' differ), the ledger the fullest stage's
 * with every stage's figures (l->ranks). */
ml_status ml__pp_evaluate(const ml_model *m, const ml_config *cfg, const ml_chain *chain,
                          bool keep_events, bool whole, ml_ledger **out, ml_error *err);
/* ml_ledger_evaluate (whole: ml__ledger_evaluate_whole) whose allocator
 * simulation is looked up in, and added to, *memo (NULL: none kept). */
ml_status ml__ledger_evaluate_with(const ml_model *m, const ml_config *cfg, bool keep_events,
                                   bool whole, ml_reserved_memo *memo, ml_ledger **out,
                                   ml_error *err);
/* zero_grad: zero — the first iteration's peak, from a replay without the
 * gradients the steady one carries; its phases' peaks into phases
 * (passes.c). */
uint64_t ml__eval_first_without_grads(ml_evalctx *x, const int *seg,
                                      ml_phase_peak phases[ML_PHASE_COUNT]);
/* The caching-allocator simulation of the plan seg[] (device.allocator):
 * fills out's reserved figures (passes.c). */
ml_status ml__eval_reserved(const ml_model *m, ml_evalctx *x, const int *seg, ml_summary *out,
                            ml_error *err);

/* have - need as a signed 64-bit headroom (ml_summary.headroom), false
 * where it does not fit: a need more than 2^63 B over. ml_config_problem
 * keeps a device below 2^63 B, so a positive headroom always fits
 * (check.c). */
bool ml__headroom(uint64_t have, uint64_t need, int64_t *out);

/* The steps of an evaluation (evaluate.c) the allocator simulation
 * (simulate.c) replays again: where each boundary lives under a plan; the
 * per-device model states; a replay of the chain under seg[] writing into
 * l; the resident states; one iteration after them. */
void ml__eval_boundaries(const ml_chain *ch, const int *seg, bool held, ml_boundary *bd);
void ml__eval_model_states(ml_chain *ch, const ml_training *t, const ml_optim_bytes *ob,
                           ml_summary *s);
void ml__eval_setup(ml_evalctx *x, const int *seg, ml_ledger *l, ml_shard *sh, ml_replay *r);
/* l's block table under the plan seg (block_table.c); after ml__eval_setup,
 * whose run flags it reads. */
void ml__eval_block_table(const ml_evalctx *x, const int *seg, ml_ledger *l);
void ml__eval_residents(ml_replay *r, const ml_evalctx *x, const ml_summary *s, bool states);
/* How the optimizer states split into tensors (reserved.h). */
ml_tensor_split ml__states_split(const ml_training *t);
/* The micro-batch's input and targets, held by the training loop. */
void ml__eval_batch(ml_replay *r, const ml_chain *ch);
double ml__eval_iteration(ml_replay *r, const ml_evalctx *x, const ml_summary *s,
                          bool create_states);

/* Which blocks sit in checkpoint segments under a fixed policy (a
 * multimodal model's training.vision_tower applied to its tower). */
ml_status ml__eval_segments(const ml_chain *ch, const ml_checkpoint *cp, int *seg, ml_error *err);
/* training.vision_tower's policy for a multimodal model's tower over seg[]
 * (sides.c; ml__eval_segments applies it). */
void ml__eval_stack_segments(const ml_chain *ch, int *seg);
/* ml_ledger_evaluate with every block of every replay replayed: no run of
 * identical layers moved over (replay_runs.c). */
ml_status ml__ledger_evaluate_whole(const ml_model *m, const ml_config *cfg, ml_ledger **out,
                                    ml_error *err);
/* The peak total and whether it fits s's device: the budget holds the
 * reserved peak where the allocator was simulated (s->has_reserved), the
 * allocator peak with cache_allow added where it is not zero, else the
 * allocator peak (verdict.c). */
ml_status ml__eval_verdict(const ml_chain *ch, const ml_device *dv, uint64_t cache_allow,
                           ml_summary *s, ml_error *err);
/* x's plan into l: its segments (searched, for checkpoint optimal), its
 * replay, and with the allocator simulated its reserved peak and verdict
 * (verdict.c). seg: n + 1 entries of scratch. */
ml_status ml__eval_plan(const ml_model *m, ml_evalctx *x, int *seg, bool keep_events,
                        ml_ledger *l, ml_error *err);
/* Replays the chain under the plan seg[] into l (summary, blocks, events). */
ml_status ml__eval_run(ml_evalctx *x, const int *seg, bool keep_events, ml_ledger *l,
                       ml_error *err);
/* checkpoint: optimal (optimal_plan.c): fills seg[], *fits. */
ml_status ml__eval_optimal(ml_evalctx *x, int *seg, ml_ledger *l, bool *fits, ml_error *err);

uint64_t ml__ceil_div(uint64_t a, uint64_t b);

/* Time (timing.c; docs/sharding.md, "Time"). The bytes each device sends per
 * iteration; the bytes it moves over the host link per iteration. */
double ml__eval_communication(const ml_chain *ch, const ml_training *t, uint64_t P);
double ml__eval_host_transfer(const ml_training *t, const ml_prec *p, uint64_t P);
/* The collectives and host transfers of the step, serially where they
 * happen: before the optimizer step (gradients reduced, offloaded ones sent
 * down), after it (parameters sent up, gathered). */
void ml__time_before_step(ml_replay *r, const ml_training *t, uint64_t P);
void ml__time_after_step(ml_replay *r, const ml_training *t, uint64_t P);
/* The step time's parts and every event's t_s (after flops are known). */
struct ml_time_map;
/* The summary's times and each event's t_s: along map (the per-op model's
 * clock, steptime.h) when it has points, else at the FLOPs' rate. */
void ml__time_finish(const ml_config *cfg, ml_ledger *l, const struct ml_time_map *map);
/* The bytes of comm_bytes that reduce the gradients (timing.c), and the
 * time of them the last micro-batch's backward covers with
 * parallel.overlap_grad_reduce at bytes_per_s (0 without). */
double ml__eval_grad_reduce_bytes(const ml_chain *ch, const ml_training *t, uint64_t P);
/* The data-parallel collectives' calls per iteration, all-reduces and
 * all-gathers or reduce-scatters (timing.c; docs/search.md, "Latency"). */
void ml__eval_collective_calls(const ml_chain *ch, const ml_training *t, uint64_t P,
                               double *allreduces, double *halves);
double ml__dp_hidden_s(const ml_summary *s, const ml_training *t, double bytes_per_s);

#endif
