/* The op graph of one block: read this first (docs/graph.md).
 *
 * A block is a list of ops over tensors, written once per layer layout by
 * composing the component kit (graph/kit.h). A tensor has a shape in named
 * dimensions and a dtype class; an op reads tensors, allocates its outputs,
 * saves tensors for its backward, drops the references the reference
 * implementation's Python scoping drops, and names its backward node: the
 * gradients it allocates and frees, by tensor, and the parameters whose
 * gradients it produces. Every figure is a pass over that list:
 *
 *   ml__graph_forward   live bytes of the forward, with grad (saved tensors
 *                       stay) or under no_grad (nothing stays), op by op
 *   ml__graph_traffic   bytes read and written and kernels launched, per op
 *   ml__graph_op_flops  forward FLOPs (all ops, or the attention core's)
 *   ledger/chain_graph.c  the saved inventory, the backward node list, the
 *                       parameters and the transients the replay runs on
 *
 * A graph is written in named dimensions; a configuration gives their sizes
 * (ml_graph_sizes). A search over micro-batches does not rebuild it for
 * each: the prepared planner (ledger/planner.c) derives the chain between
 * a few builds. Internal to the library: `ml__` marks functions that cross files but are not its API. */
#ifndef ML_GRAPH_H
#define ML_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Named dimensions. DQ, DKV, QKV and F2 are derived: H*DH, HKV*DH,
 * DQ + 2*DKV (a fused q/k/v projection's width) and 2*F; so are latent
 * attention's KVA, KVB and VO. L0 .. L0 + MLG_NLIT - 1 are literal sizes,
 * the graph's own (g->lit): a sequential layer's per-sample counts,
 * channels and widths, which shape inference gives (graph/kit_seq.h);
 * whoever sizes such a graph copies g->lit into ml_graph_sizes.dim from
 * MLG_L0. */
#define MLG_NLIT 32
typedef enum {
    MLG_B,   /* micro-batch */
    MLG_T,   /* tokens */
    MLG_D,   /* hidden (the residual stream's width) */
    MLG_H,   /* query heads */
    MLG_HKV, /* key/value heads */
    MLG_DH,  /* head size */
    MLG_F,   /* MLP width */
    MLG_V,   /* vocabulary */
    MLG_DQ,
    MLG_DKV,
    MLG_QKV,
    MLG_F2, /* 2 F: a fused gate and up projection's width */
    /* multi-head latent attention (DeepSeek): */
    MLG_RQ,  /* q_lora_rank */
    MLG_RKV, /* kv_lora_rank */
    MLG_KVA, /* kv_lora_rank + the rotated head part: kv_a_proj_with_mqa's width */
    MLG_KVB, /* H (dh - rotated part + DV): kv_b_proj's width */
    MLG_DV,  /* the value head's size */
    MLG_VO,  /* H DV: the value heads' width, o_proj's input */
    /* mixture of experts (graph/kit_moe.c): */
    MLG_E,    /* routed experts */
    MLG_K,    /* experts per token */
    MLG_FE,   /* a routed expert's width */
    MLG_FS,   /* the shared experts' width */
    MLG_ROWS, /* the busiest expert's rows (training.expert_imbalance) */
    MLG_NE,   /* an instance's rows in the graph's repeated group (g->rep):
                 one expert's share of the routed rows */
    MLG_TS,  /* T5: the encoder's tokens, the keys a decoder's cross-attention reads */
    MLG_NB,  /* T5: the relative-position buckets */
    MLG_TKV, /* the keys a fused attention's queries attend to: T, or under
                context parallelism the whole sequence (its ring visits every
                rank's keys; docs/parallel.md) */
    MLG_EL,  /* the routed experts a rank holds: E, or E / ep under expert
                parallelism (docs/parallel.md) */
    MLG_R,   /* the experts' dispatch (expert, expert-tensor or tensor
                parallelism): the (token, expert) rows the rank's experts
                take, their runs summed */
    MLG_RA,  /* the same: the rows the all-to-all brings the rank, R / etp
                (the all-gather over the expert-tensor ranks makes them R) */
    MLG_PS,  /* the same: the (token, expert) pairs the rank sends, k B T of
                its tokens, fewer with an expert capacity (dropped), E x the
                capacity when padded */
    MLG_L0,
    MLG_NDIMS = MLG_L0 + MLG_NLIT
} mlg_dim;

/* Dtype classes: their bytes come from the precision policy. */
typedef enum {
    MLG_COMPUTE, /* matmul-class activations: the compute dtype */
    MLG_STREAM,  /* the residual stream (fp32 under autocast) */
    MLG_FP32,
    MLG_HALF,    /* autocast's low-precision copies */
    MLG_INT64,
    MLG_BOOL,    /* one byte: masks */
    MLG_PARAM,   /* a parameter (its gradient: the gradient dtype) */
    MLG_NDTYPES
} mlg_dtype;

enum {
    MLG_ACT = 0,   /* an activation the block makes */
    MLG_INPUT = 1, /* the block's input: its caller holds it */
    MLG_PARAMETER = 2,
    MLG_VIEW = 3,  /* a view of `base`: no storage of its own */
    MLG_BATCH = 4, /* part of the batch the loop holds all iteration (the
                      targets): saving it lists nothing (chain.h,
                      ML_SV_BATCH) */
};

enum {
    MLG_T_CORE = 1,  /* attention core: dropped under selective checkpointing */
    MLG_T_TMP = 2,   /* one of the block rule's transients (docs/ledger.md,
                        "transients"), the largest of which sizes the
                        allocator simulation's units */
    MLG_T_WCAST = 4, /* autocast's weight copy */
    MLG_T_HALF = 8,  /* half the bytes of its shape (rotate_half's -x2) */
    MLG_T_SHARED = 16, /* a parameter another block owns (tied weights): not
                          listed here; its gradient counts in the node */
    MLG_T_KEPT = 32,   /* saved, but released by no node: it goes with the
                          block's other saved tensors once its backward has
                          run (Falcon's 8-byte index lists, whose release
                          within the backward the chain does not time) */
    MLG_T_EXPERT = 64, /* a routed expert's parameter: registered once per
                          expert the rank holds (MLG_EL), its group's
                          parameters in turn */
    MLG_T_SIDE = 128,  /* a tensor beside the stream of blocks (chain.h, a side
                          tensor: T5's position bias, its encoder's output):
                          the chain holds it, so saving it lists nothing */
};

/* mlg_op.sp_site: a column-parallel op reads a sequence shard (gathered
 * first, gathered again in its backward, its input's gradient
 * reduce-scattered); a row-parallel op reduce-scatters its whole output
 * into a shard (its output's gradient gathered in its backward). */
enum { MLG_SP_NONE = 0, MLG_SP_COLUMN = 1, MLG_SP_ROW = 2 };

#define MLG_NONE 0xffffu
#define MLG_MAX_TENSORS 160
#define MLG_MAX_OPS 160
#define MLG_MAX_RUNS 3

typedef struct {
    const char *name;
    uint8_t dim[6], ndim;
    uint8_t factor;   /* a whole multiple of the product (mean and rstd: 2) */
    uint8_t dtype;    /* mlg_dtype */
    uint8_t role;     /* MLG_ACT, MLG_INPUT, MLG_PARAMETER, MLG_VIEW */
    uint8_t flags;    /* MLG_T_* */
    uint16_t base;    /* a view's storage; a saved tensor counted in the entry
                         of another (bmm's operand copies): that one */
    uint8_t group;    /* a parameter's module: parameters are listed by group
                         (the order modules register them), then by op */
    bool local;       /* of the rank's own tokens without a token dimension
                         (the dispatch's pairs): under sequence parallelism
                         what they make with T is sharded */
    bool seq;         /* sequence parallelism: a rank holds T / seq_div of its
                         tokens (ml__graph_shard_sequence) */
    uint8_t table;    /* the model's rotary table, made once for every layer
                         (MLG_TABLE_*); 0: none */
} mlg_tensor;

/* Op kinds: the kernel class of each op, for the time model. */
typedef enum {
    MLG_OP_MATMUL,
    MLG_OP_ELEMENTWISE,
    MLG_OP_NORM,
    MLG_OP_SOFTMAX,
    MLG_OP_DROPOUT,
    MLG_OP_ATTENTION, /* a fused attention kernel */
    MLG_OP_COPY,      /* a contiguous copy, a cast */
    MLG_OP_VIEW,      /* no kernel, no storage */
    MLG_OP_KINDS
} mlg_op_kind;

/* The rotary tables: mlg_op.table, the one a product multiplies by (cos or
 * sin); mlg_tensor.table, the one a tensor is (also DeepSeek-V2's complex
 * freqs_cis, whose products free nothing). */
enum { MLG_TABLE_COS = 1, MLG_TABLE_SIN = 2, MLG_TABLE_CIS = 4 };

typedef struct {
    const char *name;    /* static: the forward op */
    uint8_t kind;        /* mlg_op_kind */
    uint8_t nin, nout, nsave, nfree, nparam, ngin, ngout;
    uint16_t in[3];      /* read */
    uint16_t out[3];     /* allocated, in order */
    uint16_t save[6];    /* saved for the backward (the first saver releases) */
    uint16_t free[6];    /* last references dropped once it has run */
    uint16_t param[2];   /* parameters, in registration order */
    double flops;        /* a whole multiple of the product of fdim */
    uint8_t fdim[6], nfdim;
    bool core;           /* its FLOPs are the attention core's */
    bool causal;         /* a fused attention kernel under a causal mask: it
                            skips the blocks above the diagonal (the time
                            model's; its FLOPs are counted whole) */
    uint8_t kernels;     /* kernels it launches (a view: none) */
    /* the backward node (node NULL: none) */
    const char *node;
    uint16_t gin[2];     /* tensors whose gradients it allocates */
    uint16_t gout[3];    /* tensors whose gradients it frees */
    uint16_t accum;      /* a gradient then added in place into the buffer
                            already held for the same tensor (input_buffer.cpp) */
    uint8_t scratch_in;  /* scratch tensors as large as gin[0]'s gradient
                            (a softmax's node: one, set by ml__op_node) */
    bool scratch_one;    /* the scratch is one tensor of scratch_in times
                            gin[0]'s gradient (a gradient made in a wider
                            dtype, then cast), not scratch_in of them */
    bool scratch_first;  /* the node makes its scratch before its gradients:
                            a formula's temporaries, which C++ frees in
                            reverse at the end of the expression
                            (pow_backward), or a broadcast input's gradient
                            made whole, before sum_to reduces it in
                            engine.cpp's validate_outputs, when that input
                            comes first in the codegen's sorted order, or a
                            gradient made in a wider dtype, before
                            validate_outputs casts it (scratch_one) */
    uint8_t table;       /* a rotary product by the model's table (MLG_TABLE_COS
                            or MLG_TABLE_SIN), which its node releases: the
                            table goes at the first rotary layer's last such
                            node (ml__chain_mark_tables) */
    uint8_t scratch_early; /* of scratch_in tensors made first (scratch_first),
                              how many the formula frees before the node's
                              gradients: its temporaries, which C++ frees in
                              reverse at the end of the full expression whose
                              result (the last tensor) the node keeps (the
                              in-place divide's three of four) */
    bool overfull;       /* a builder listed more than an array holds */
    uint8_t sp_site;     /* sequence parallelism's collective at this op
                            (ml__graph_shard_sequence): MLG_SP_COLUMN, MLG_SP_ROW */
    bool accum_but_last; /* in the repeated group: accum, except in the last
                            instance, whose node runs first in backward and
                            makes the buffer */
} mlg_op;

/* An op group repeated: the tensors [t0, t1) and the ops [o0, o1) stand
 * for one instance each of a list of instances that differ only in the
 * size of MLG_NE (Mixtral's experts, each on its rows: ml_graph_sizes.runs).
 * The passes that expand it list the group's saved tensors and backward
 * nodes once per instance, at its size, where the group is declared; a
 * parameter the group's ops use is declared outside it (an expert's is
 * MLG_T_EXPERT: E of each, whichever experts take rows); a repeated op's
 * FLOPs are written for all instances together (named in K·B·T, the rows
 * they share) and counted once. t1 == t0: no group. */
typedef struct {
    uint16_t t0, t1, o0, o1;
} mlg_repeat;

typedef struct {
    mlg_tensor t[MLG_MAX_TENSORS + 1]; /* the last: what a full graph's new
                                          tensors are (never valid) */
    mlg_op op[MLG_MAX_OPS];
    uint16_t nt, nop;
    uint8_t group; /* the group new parameters join */
    bool full;  /* more tensors or ops than the arrays hold: refused */
    mlg_op sink; /* what a full graph's builders write to, never read */
    uint16_t out;  /* the block's output tensor, when the builder names it
                      (MLG_NONE: not named): saved, it is a boundary the
                      replay releases; the block's input: an identity block */
    uint8_t nlit;
    uint64_t lit[MLG_NLIT]; /* the sizes of MLG_L0 + i */
    mlg_repeat rep; /* the group repeated once per instance (none: t1 == t0) */
    uint64_t seq_div; /* sequence parallelism's ranks, once sharded (0: none) */
    uint16_t grad_view; /* a parameter whose gradient reaches AccumulateGrad as
                           a view of the stream's gradient (ViT's class token,
                           through cat and expand): at a batch of one the view
                           needs no sum and becomes its .grad, keeping the
                           whole storage (docs/inventory.md, "A batch of
                           one"); MLG_NONE: none */
} ml_graph;

/* The sizes a configuration substitutes: each dimension's, and the bytes
 * of each dtype class. */
typedef struct {
    uint64_t dim[MLG_NDIMS];
    unsigned bytes[MLG_NDTYPES];
    unsigned grad_bytes; /* a parameter gradient's element */
    bool overflow;       /* a product passed 64 bits (sticky) */
    /* the repeated group's instances (g->rep), in order: runs of `count`
     * instances with MLG_NE `size` each */
    struct {
        uint64_t count, size;
    } runs[MLG_MAX_RUNS];
    unsigned nruns;
    uint64_t seq_div; /* sequence parallelism's ranks: a tensor marked seq
                         holds T / seq_div tokens (0 or 1: none) */
} ml_graph_sizes;

/* Tensor parallelism's split dimensions (Megatron's column- and
 * row-parallel linears shard the heads, the MLP width and the vocabulary):
 * whether tensor t has one. */
bool ml__graph_tp_split(const ml_graph *g, uint16_t t);
/* Marks the tensors that sequence parallelism shards over the tokens
 * (docs/parallel.md): the block's input, what the ops make from sharded
 * tensors without a split dimension, and what a row-parallel op (one that
 * reads a split tensor or parameter and writes none) reduce-scatters; not
 * what a column-parallel op makes (its input gathered first), nor a split
 * tensor; the ops at the collectives get their sp_site. div: the ranks. */
void ml__graph_shard_sequence(ml_graph *g, uint64_t div);

/* ---- building (graph.c) ---- */
void ml__graph_init(ml_graph *g);
/* A tensor of `ndim` named dimensions (variadic: mlg_dim values). */
uint16_t ml__graph_tensor(ml_graph *g, const char *name, uint8_t dtype, uint8_t role,
                          unsigned ndim, ...);
/* A view of base with its own shape (its gradient is its shape's). */
uint16_t ml__graph_view(ml_graph *g, const char *name, uint16_t base, unsigned ndim, ...);
/* The dimension of literal size v (MLG_L0 on, g->lit): a graph out of
 * slots is full. */
uint8_t ml__graph_lit(ml_graph *g, uint64_t v);
mlg_op *ml__graph_op(ml_graph *g, uint8_t kind, const char *name);
void ml__op_in(mlg_op *o, uint16_t t);
void ml__op_out(mlg_op *o, uint16_t t);
void ml__op_save(mlg_op *o, uint16_t t);
void ml__op_free(mlg_op *o, uint16_t t);
void ml__op_param(mlg_op *o, uint16_t t);
void ml__op_flops(mlg_op *o, double k, unsigned ndim, ...);
/* The backward node: its name, then the gradients it allocates and frees. */
void ml__op_node(mlg_op *o, const char *node);
void ml__op_gin(mlg_op *o, uint16_t t);
void ml__op_gout(mlg_op *o, uint16_t t);

/* An op reading x and making y (MLG_NONE: none); with a node (not NULL),
 * one whose backward makes x's gradient from y's: the shape of most ops. */
mlg_op *ml__graph_step(ml_graph *g, uint8_t kind, const char *name, uint16_t x, uint16_t y,
                       const char *node);
/* An op that launches nothing and only drops references (a function
 * returning, a name rebound). */
mlg_op *ml__graph_release(ml_graph *g, const char *name);

/* The repeated group (mlg_repeat): the tensors [t0, t1) and the ops
 * [o0, o1), g->nt and g->nop as the builder found them before and after
 * declaring each (a composition declares in the inventory's order, then
 * emits in the forward's). One group a graph: a second is refused. */
void ml__graph_repeat(ml_graph *g, uint16_t t0, uint16_t t1, uint16_t o0, uint16_t o1);
/* Whether tensor t / op k is in the repeated group. */
bool ml__graph_repeated_tensor(const ml_graph *g, uint16_t t);
bool ml__graph_repeated_op(const ml_graph *g, uint16_t k);

/* Whether g is whole: no array overfull, every tensor an op names
 * declared; a repeated group within the arrays, its saved tensors saved by its own
 * ops only, and a tensor outside it that its ops save flagged kept (one
 * entry, released by no instance's node). A builder's bug, refused rather
 * than planned. */
bool ml__graph_valid(const ml_graph *g);

/* ---- passes (graph.c) ---- */
/* Tensor t's elements at sizes z (its factor times its dimensions); sets
 * *overflow when the product passes 64 bits. */
uint64_t ml__graph_numel(const ml_graph *g, const ml_graph_sizes *z, uint16_t t, bool *overflow);

/* Every tensor's bytes at sizes z into tb[0 .. g->nt): a view's its own
 * shape's (its gradient's; it has no storage). Sets z->overflow when a
 * product passes 64 bits. */
void ml__graph_bytes(const ml_graph *g, ml_graph_sizes *z, uint64_t *tb);
/* The bytes of the repeated group's tensors in tb at MLG_NE = size (the
 * others' stay): one instance's (sets z->dim[MLG_NE]). */
void ml__graph_instance_bytes(const ml_graph *g, ml_graph_sizes *z, uint64_t size,
                              uint64_t *tb);
/* The tensor whose storage t is (a view's base, else t). */
uint16_t ml__graph_storage(const ml_graph *g, uint16_t t);
/* The tensor whose saved entry t counts in (bmm's operand copies: the
 * first; else t's storage). */
uint16_t ml__graph_entry(const ml_graph *g, uint16_t t);

/* The forward, op by op: each op allocates its outputs, then the tensors
 * whose last reference went are freed; with grad, a tensor an op saved
 * stays. The block's input is not counted (its caller holds it). In eval
 * mode dropouts are the identity. Not expanded for a repeated group: a
 * graph with one is `bad` here. */
typedef struct {
    uint64_t live, peak;
    bool bad; /* a free of more than is live, or an overflow */
} ml_graph_live;
void ml__graph_forward(const ml_graph *g, const uint64_t *tb, bool grad, bool eval,
                       ml_graph_live *out);

/* The same forward, as its allocations and frees in order (with grad, a
 * storage an op saved is never freed here: its backward frees it):
 * step i allocates `bytes` (alloc) or frees the allocation of part `part`
 * of storage tok. A tensor PyTorch makes as several (its factor n:
 * LayerNorm's mean and rstd, matmul's contiguous copies of q and k for
 * bmm) is n allocations, one a part, in order; a dropout makes its mask
 * before its output. The block's input is the caller's (never allocated,
 * never freed here); a row-parallel op's whole output (tok MLG_STEP_WHOLE)
 * is allocated before the op's outputs and freed after them. One walk
 * with ml__graph_forward (its live bytes into *out, as that gives them):
 * writes at most cap steps and returns the count, 0 where the graph has no
 * such list (a repeated group, more than cap steps, a storage made twice or
 * freed unmade, `bad`). */
#define MLG_STEP_PARTS 2
#define MLG_STEP_WHOLE MLG_MAX_TENSORS
typedef struct {
    uint64_t bytes;
    uint16_t tok;
    uint8_t part;
    bool alloc;
} mlg_step;
size_t ml__graph_forward_steps(const ml_graph *g, const uint64_t *tb, bool grad, bool eval,
                               mlg_step *st, size_t cap, ml_graph_live *out);

/* Bytes read and written and kernels launched by each op of the forward
 * (per_op: g->nop entries, or NULL) and in all (a view reads and writes
 * nothing, launches nothing; in eval mode a dropout is the identity). A
 * repeated group's ops are counted once, at the sizes tb has. */
typedef struct {
    uint64_t read, written;
    unsigned kernels;
} ml_graph_traffic;
void ml__graph_traffic(const ml_graph *g, const uint64_t *tb, bool eval,
                       ml_graph_traffic *per_op, ml_graph_traffic *total);

/* One op's forward FLOPs at sizes z. */
double ml__graph_op_flops(const mlg_op *o, const ml_graph_sizes *z);

#endif
