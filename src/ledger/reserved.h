/* The replay's events through the caching-allocator simulator (src/alloc/):
 * each aggregate the replay allocates (a block's saved tensors, its
 * gradients, the optimizer states) is split into the tensors PyTorch
 * allocates one by one, and each free releases the tensors of the matching
 * allocation. Internal to src/ledger/; docs/allocator.md, "On the plan". */
#ifndef ML_RESERVED_H
#define ML_RESERVED_H

#include "alloc/alloc.h"
#include "ledger/chain.h"

/* How an aggregate splits into tensors. */
typedef enum {
    ML_T_ONE,            /* one tensor */
    ML_T_SAVED,          /* block's saved tensors */
    ML_T_SAVED_NONCORE,  /* ... without the attention core (selective) */
    ML_T_SAVED_CORE,     /* ... the attention core only */
    ML_T_BLOCK_PARAMS,   /* one tensor per parameter tensor of the block */
    ML_T_BLOCK_GRADS,    /* the block's new .grad tensors: the same, with the
                            one that keeps a view's storage that much larger
                            (ml_cblock.grad_view) */
    ML_T_ALL_PARAMS,     /* one tensor per parameter tensor of the model, the
                            bytes shared out by their sizes */
    ML_T_TRAINED_PARAMS, /* ... of those that train (not a frozen tower's):
                            master weights */
    ML_T_GRAD_PARAMS,    /* ... of those that also get a gradient (not an unused
                            layer's): gradients, torch.optim's states and its
                            step's temporaries */
    ML_T_SHARD,          /* Megatron's distributed optimizer: one tensor per piece
                            of the rank's shard (dist_optimizer.c), `copies` each */
    ML_T_UNITS_FWD,      /* a forward transient: tensors of the block's unit_fwd */
    ML_T_UNITS,          /* a no_grad transient: tensors of the block's unit */
    ML_T_UNITS_BWD,      /* a backward transient: the incoming gradient (bwd_in),
                            then tensors of the block's unit */
    ML_T_SIDE,           /* the side tensors a checkpoint keeps (chain.h,
                            ckpt_side): the position ids, then the mask */
    ML_T_HELD,           /* what evaluation's output and autocast hold after
                            the block: its keys and values (cache_unit each),
                            then its weight copies (its saved tensors flagged
                            ML_SV_WCAST) */
} ml_tensor_split;

typedef struct ml_rsim ml_rsim;

/* A simulator with an empty cache for the chain's blocks. */
ml_status ml__rsim_create(const ml_alloc_config *cfg, const ml_chain *ch, ml_rsim **out,
                          ml_error *err);
void ml__rsim_destroy(ml_rsim *r);
/* The chain whose saved tensors ML_T_SAVED* name (the evaluation pass
 * builds its own, with the same parameters). */
void ml__rsim_use_chain(ml_rsim *r, const ml_chain *ch);
/* The data-parallel ranks and model chunks ML_T_SHARD lays the shard out
 * over (1 and 1 when not set). */
void ml__rsim_set_shards(ml_rsim *r, uint64_t dp, uint64_t chunks);

/* Allocates `bytes` of category c as the tensors `split` says (`copies`
 * tensors for each, for the *_PARAMS splits: Adam's two states per parameter).
 * When the tensors do not add up to `bytes` (a calibrated inventory, a
 * tied table) it is one tensor. */
void ml__rsim_alloc(ml_rsim *r, ml_category c, uint64_t bytes, ml_tensor_split split,
                    size_t block, unsigned copies);
/* Frees the latest live allocation of category c of exactly `bytes`, or
 * every live one of c when `bytes` is their sum (zero_grad). */
void ml__rsim_free(ml_rsim *r, ml_category c, uint64_t bytes);
/* One allocation of bytes that stays for the process's life, in no
 * category (a cuBLAS handle's workspace): nothing frees it. */
void ml__rsim_pin(ml_rsim *r, uint64_t bytes);
/* A name for the latest live allocation of category c, for
 * ml__rsim_free_named while it is live (0: none). Where two allocations
 * have the same bytes, a free by bytes takes the latest; a tensor that
 * outlives a later one of its size (a gradient handed to the block
 * before) is freed by its name instead. */
size_t ml__rsim_latest(const ml_rsim *r, ml_category c);
/* The names of the chain's side tensors (chain.h, ml_side), kept here so
 * that each is freed as the allocation it is: by size, a free could
 * release another tensor of that size made since (T5's position bias and
 * its gradient are each as large as a layer's attention scores). Slot: the
 * side tensor as its maker's forward makes it, its gradient, or a
 * recompute's copy. _note names side i's slot the latest allocation of c
 * (nothing when the host is out of memory: its free is then by size);
 * _take returns it (0: none) and forgets it. */
enum { ML_SIDE_MADE, ML_SIDE_GRAD, ML_SIDE_RECOMPUTED, ML_SIDE_SLOTS };
void ml__rsim_side_note(ml_rsim *r, size_t side, unsigned slot, ml_category c);
size_t ml__rsim_side_take(ml_rsim *r, size_t side, unsigned slot);
/* The same for the key/value cache the model output holds in training (a
 * workspace tensor per block, HF's use_cache), which goes with the output:
 * _note names block k's of this micro-batch; _age makes this micro-batch's
 * the previous one's (the loop keeps the output); _take returns block k's
 * of this micro-batch or (prev) the previous one's, and forgets it. */
void ml__rsim_cache_note(ml_rsim *r, size_t block);
void ml__rsim_cache_age(ml_rsim *r);
size_t ml__rsim_cache_take(ml_rsim *r, size_t block, bool prev);
/* Frees the allocation so named; false when it is not live (nothing
 * changed). */
bool ml__rsim_free_named(ml_rsim *r, ml_category c, size_t name);

/* The job's starting state (ml_device.start): t's events through the
 * simulator before any of the plan's, what they leave allocated and
 * reserved kept, then the peaks reset to the current values
 * (torch.cuda.reset_peak_memory_stats). False when the state alone does
 * not fit the device (or the host ran out of memory): the simulation has
 * failed. */
bool ml__rsim_start(ml_rsim *r, const ml_alloc_trace *t);
/* The simulator's configuration for device dv (its allocator, its
 * max_split_size, its memory less the runtime reserve). */
ml_alloc_config ml__rsim_config(const ml_device *dv);
/* The bytes dv->start leaves allocated (0 without one, or when it does not
 * run to its end: the plan's simulation says why). */
uint64_t ml__rsim_start_held(const ml_device *dv);
/* What the process holds before the plan's first tensor: the start state's
 * allocations, or without one the cuBLAS workspaces a new process makes and
 * keeps, one per thread that runs products (the forward's and the autograd
 * engine's: passes.c, simulate). */
uint64_t ml__rsim_process_held(const ml_device *dv);

/* Frees saved entry `entry` (its index in block's saved list) of the
 * latest live ML_T_SAVED allocation of category c for that block, as the
 * autograd node that releases it does (engine.cpp: release_variables once
 * the node has run); the others stay until the allocation is freed. False
 * when there is none, or it is one tensor (nothing changed). */
bool ml__rsim_free_saved(ml_rsim *r, ml_category c, size_t block, size_t entry);
/* The oldest live allocation of category `from` of `bytes` counted in
 * category `to` from now on: the same tensors, nothing allocated or freed
 * (a tensor the replay recategorizes: the mask a checkpoint keeps, made
 * before the layer whose steps may hold a tensor of its size). */
void ml__rsim_move(ml_rsim *r, ml_category from, ml_category to, uint64_t bytes);
/* Opens block's ML_T_SAVED allocation of category c and `bytes` with no
 * tensor made yet: `per` handles for each of its `entries` (its saved
 * entries; autocast's weight copies without grad), which the forward's
 * steps fill as its ops run (ml__rsim_saved_fill); freed as the other
 * ML_T_SAVED allocations are, each entry's filled handles together, or
 * whole by its bytes. */
void ml__rsim_saved_open(ml_rsim *r, ml_category c, uint64_t bytes, size_t block,
                         size_t entries, unsigned per);
/* Makes the allocation of `bytes` that fills handle `slot` of saved entry
 * `entry` in block's open ML_T_SAVED allocation of category c. */
void ml__rsim_saved_fill(ml_rsim *r, ml_category c, size_t block, size_t entry, unsigned slot,
                         uint64_t bytes);
/* Frees what is left of block's ML_T_SAVED allocation of category c and
 * `bytes` (its backward has ended), else as ml__rsim_free. */
void ml__rsim_free_block_saved(ml_rsim *r, ml_category c, size_t block, uint64_t bytes);

/* Records every allocation and free from now on (ml_sim_event), and a
 * mark where a pass starts (out of host memory the simulation fails, as a
 * request would: ml__rsim_ok). ml__rsim_take_events hands the record over
 * (the caller frees it; NULL when none). */
void ml__rsim_record(ml_rsim *r);
void ml__rsim_mark(ml_rsim *r, ml_reserved_when when, bool second);
ml_sim_event *ml__rsim_take_events(ml_rsim *r, size_t *n);

/* Frees the allocation so named, else (not live, or name 0) `bytes` as
 * ml__rsim_free does, counted once as inexact. ml__rsim_inexact: the frees
 * that did not find their tensor (these, a saved entry with no allocation,
 * a size no live allocation has). */
void ml__rsim_free_as(ml_rsim *r, ml_category c, size_t name, uint64_t bytes);
uint64_t ml__rsim_inexact(const ml_rsim *r);

/* False once a request failed: the device ran out, or the host (*nomem). */
bool ml__rsim_ok(const ml_rsim *r, bool *nomem);
void ml__rsim_stats(const ml_rsim *r, ml_alloc_stats *out);
/* Its reserved bytes' peak so far. */
uint64_t ml__rsim_reserved_peak(const ml_rsim *r);

#endif
