/* The chain of blocks one training iteration runs through, with each block's
 * activation inventory (docs/inventory.md), parameters and FLOPs. Built from a
 * model and a config; consumed by the replay (replay.c) and the optimizer
 * model (optim.c). */
#ifndef ML_CHAIN_H
#define ML_CHAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "graph/graph.h"
#include "memledger/ledger.h"
#include "model/model_internal.h"

/* Bytes per element under a precision policy (docs/precision.md). */
typedef struct {
    unsigned param;  /* working parameters */
    unsigned grad;   /* gradients */
    unsigned master; /* fp32 master copy, 0 when none */
    unsigned state;  /* optimizer state values */
    unsigned a;      /* matmul-class activations: the compute dtype */
    unsigned w;      /* residual stream and ops kept in fp32 by autocast */
    bool autocast;   /* torch.autocast: linear inputs and weights are cast copies */
    bool fp16;       /* the 2-byte dtype is float16 (else bfloat16) */
} ml_prec;

ml_prec ml__prec_of(ml_precision p);

enum {
    ML_SV_INPUT = 1,  /* the block's input: a boundary tensor, not in saved_bytes */
    ML_SV_CORE = 2,   /* attention core: dropped and recomputed under `selective` */
    ML_SV_OUTPUT = 4, /* the block's own output: a boundary tensor, not in saved_bytes */
    ML_SV_BATCH = 8,  /* part of the batch the loop holds (the targets): resident */
    ML_SV_WCAST = 16, /* autocast's copy of a weight (part of cast_bytes) */
    /* the model's rotary tables, made once for every layer (the graph's
     * MLG_TABLE_COS, _SIN and _CIS) */
    ML_SV_TABLE_COS = 32,
    ML_SV_TABLE_SIN = 64,
    ML_SV_TABLE_CIS = 128,
    ML_SV_TABLES = ML_SV_TABLE_COS | ML_SV_TABLE_SIN | ML_SV_TABLE_CIS,
};

typedef struct {
    const char *what;  /* static description, e.g. "softmax output" */
    uint64_t bytes;
    unsigned flags;
    uint32_t node;     /* the backward node (index in its block's node list) that
                          releases it, ML_NODE_NONE: released when the block's
                          backward ends */
    uint32_t next_same; /* the next saved tensor (index in the block's list) that
                           node releases, ML_NODE_NONE: none (set when the block
                           closes) */
} ml_saved;

#define ML_NODE_NONE UINT32_MAX

/* One autograd node of a block's backward (docs/ledger.md, "Backward, node
 * by node"). A block's nodes are kept in the order the engine runs them
 * (engine.cpp's ready queue pops the highest sequence number first: the
 * reverse of the forward's op order). Gradient buffers are counted by
 * bytes: the block starts holding its output's gradient (bwd_in) and ends
 * holding its input's (in_bytes, none when in_nograd), so the sum of
 * grad_in plus bwd_in equals the sum of grad_out plus the input's gradient
 * (a transformer block's two are one buffer). */
typedef struct {
    const char *what;     /* static: the node, e.g. "AddmmBackward0 (MLP out)" */
    uint64_t grad_in;     /* gradients w.r.t. its inputs it allocates */
    uint64_t param_grad;  /* parameter gradients it produces (AccumulateGrad
                             steals them as .grad, or adds them into .grad) */
    uint64_t scratch;     /* allocated and freed inside the node */
    uint64_t grad_out;    /* earlier gradient bytes freed once it has run: its
                             grad_output unless a residual's InputBuffer still
                             holds it; for an accumulation node, the gradient
                             added in place into the buffer */
    uint32_t first_saved; /* the first saved tensor (index in its block's list) it
                             releases, ML_NODE_NONE: none; the others follow
                             through ml_saved.next_same, in the list's order */
    /* The tensors behind grad_in and grad_out, for the allocation
     * simulation, which makes and frees each gradient as the tensor it is
     * (reserved.h): a node of an op graph allocates the gradient of each
     * tensor in gin_id (gin_b bytes each) and frees those of gout_id
     * (gout_b each). Ids are the tensors' in the block's graph,
     * ML_GID_INPUT the block's input; a gradient no node of the block made
     * is the block's incoming one, passed on by residual sums. accum: an
     * accumulation node, which frees the gradient just made for
     * gout_id[0] (added in place into the one its buffer holds); gin_acc's
     * bit j: gin part j is that gradient. ngin, ngout 0: no parts (freed
     * by bytes). */
    uint16_t gin_id[4], gout_id[3];
    bool accum_copy;  /* an accumulation node that adds out of place: the
                         buffer's old sum is held by a node still to run
                         (input_buffer.cpp, can_accumulate_inplace), so a
                         new sum (grad_in) becomes the buffer's */
    bool frees_carry; /* the last node holding that old sum (the block's
                         incoming gradient): its grad_out frees it */
    bool into_incoming; /* the block's first accumulation (in backward
                           order) into the buffer its residual sums pass the
                           incoming gradient on to: out of place where
                           something outside the graph holds that gradient
                           (ml_chain.grad_held) */
    uint8_t scratch_early; /* of scratch_parts, how many (the first made)
                              are freed before the node's gradients
                              (mlg_op.scratch_early; replay_nodes.c, early_bytes) */
    uint8_t frees_table;   /* the model's rotary tables (MLG_TABLE_COS,
                              MLG_TABLE_SIN bits) this node releases last:
                              the first rotary layer's last product by each
                              (ml__chain_mark_tables) */
    uint64_t gin_b[4], gout_b[3];
    uint8_t ngin, ngout, gin_acc;
    bool accum;
    bool pg_first; /* its parameter gradient made before grad_in: MmBackward0
                      (a product without bias: derivatives.yaml's mm makes
                      mat2's, the weight's, first, the codegen taking the
                      inputs in sorted order) */
    uint8_t scratch_parts; /* scratch as that many tensors of equal size
                              (the simulation's; 0 or 1: one tensor),
                              freed in reverse order */
    bool scratch_first;    /* scratch made before the node's gradients
                              (mlg_op.scratch_first) */
    bool unpacks;          /* its op saved tensors, which it unpacks: under
                              non-reentrant checkpointing the first such node
                              of a segment's backward runs its recompute; the
                              nodes before it (a residual sum's autocast cast
                              of the gradient) run before */
    uint64_t pg_bias; /* of a node with two parameters (a weight and its bias,
                         a LayerNorm's gamma and beta), the second's gradient:
                         a tensor of its own, made after the first's
                         (AddmmBackward0's self comes last in sorted order,
                         its sum_to in engine.cpp's validate_outputs), below
                         param_grad; 0: the parameters' gradients are one
                         tensor */
} ml_bnode;

/* The most tensors a node's scratch is made of (ml_bnode.scratch_parts). */
#define ML_SCRATCH_PARTS 4

/* Gradient ids of ml_bnode: tensor t of the block's graph (graph.h,
 * MLG_MAX_TENSORS of them) or the block's input (ML_GID_INPUT) is t, or
 * part j of a tensor that is several (a copy of q and k into one) t + j *
 * (ML_GIDS + 1); ML_GID_NONE: a gradient no node of the block makes. */
#define ML_GIDS 160
#define ML_GID_INPUT ML_GIDS
#define ML_GID_PARTS 2
#define ML_GID_NONE ((ML_GIDS + 1) * ML_GID_PARTS)

/* What one op, or its backward node, does to the device (work.h). */
typedef struct {
    uint8_t kind;    /* mlg_op_kind */
    bool bwd;        /* the op's backward node, not its forward */
    uint8_t esize;   /* a matrix product's element bytes */
    uint8_t kernels; /* kernels launched */
    bool core;       /* part of the attention core (selective checkpointing
                        recomputes it) */
    bool causal;     /* fused attention under a causal mask (mlg_op.causal) */
    double flops, bytes;
    /* a matrix product's shape: batch products of (m x k) by (k x n); all
     * 0: not a product */
    double m, n, k, batch;
} ml_work_item;

typedef struct {
    /* where the block is (the rest, from fwd_phase on, is what it is:
     * ml__chain_mark_runs compares that part of two blocks) */
    char name[48];
    int ckpt_index;          /* index in checkpoint lists, -1: not checkpointable */
    size_t saved_first, node_first;
    uint32_t work_first;     /* where its work items lie (below) */
    bool like_prev;          /* the same block as the one before it, but for the
                                fields above (ml__chain_mark_runs; the replay
                                skips runs of them, replay_runs.c) */
    ml_phase fwd_phase;      /* forward, or loss for the loss block */
    uint64_t params;         /* elements */
    size_t nsaved;
    size_t nnodes;           /* backward nodes in execution order, from node_first;
                                0: the block-level backward (ws_bwd) */
    uint64_t saved_bytes;    /* inventory without the boundary tensors */
    uint64_t core_bytes;     /* part flagged ML_SV_CORE */
    uint64_t cast_bytes;     /* part that is autocast's weight copies */
    /* The boundary tensor between block k-1 and block k is block k's input.
     * Who saves it decides when it is resident (docs/ledger.md). */
    uint64_t in_bytes;       /* the block's input tensor */
    bool in_saved;           /* an op of this block saves its input */
    bool out_saved;          /* an op of this block saves its own output */
    bool identity;           /* output is a view of the input (flatten, p=0
                                dropout): the two boundaries share a storage */
    bool in_held;            /* the caller holds the input until this block's
                                backward is done (the logits before the loss) */
    bool in_nograd;          /* the input needs no gradient (the model's input):
                                its backward ends with none to hand over */
    bool inplace;            /* its op overwrites its input (relu inplace: true): the
                                replay frees the input before the output exists,
                                unless something keeps the input */
    bool nodes_off;          /* an op of the block has no node rule: its node
                                list is dropped and the block-level rule runs */
    uint64_t ws_fwd;         /* transient bytes while its forward runs */
    uint64_t ws_nograd;      /* the same under no_grad (checkpointed forward),
                                where saved tensors are transients too */
    uint64_t ws_bwd;         /* transient bytes while its backward runs */
    /* how ws_fwd and ws_nograd were found: from the forward op by op (the
     * graph's forward pass, docs/ledger.md "The forward, op by op"), by a
     * formula of the block's own (the loss's tensors), or else by the block
     * rule (twice the largest tensor, "Transients"); ml_transients */
    bool ws_fwd_ops, ws_nograd_ops, ws_formula;
    uint64_t unit_fwd, unit;  /* the tensors the transients are made of: the largest
                                 unsaved one (forward), the largest (no_grad and
                                 backward); for the allocator simulation */
    uint64_t bwd_in;          /* the incoming gradient, part of ws_bwd */
    uint64_t tied_grad;       /* a tied V x D table's gradient, one tensor: the LM
                                 head's partial (part of grad_bytes and
                                 grad_accum_bytes), the embedding's own dense
                                 one (part of ws_bwd); for the allocator
                                 simulation */
    uint64_t grad_bytes;     /* gradients first created by its backward */
    uint64_t grad_view;      /* what one parameter's new .grad keeps beyond its
                                own elements, not in grad_bytes: a view of a
                                larger gradient, stolen by AccumulateGrad (ViT's
                                class token at a batch of one: the embeddings'
                                gradient, T x D more); kept where the gradients
                                are whole tensors (ml_shard.grad_views) */
    uint32_t grad_view_param; /* 1 + that parameter's index in params; 0: none */
    uint64_t grad_accum_bytes; /* gradients it produces into existing .grad (accumulation) */
    double flops_fwd, flops_bwd, flops_core;
    bool measured;           /* saved bytes from a calibration profile */
    uint64_t cache_bytes;    /* keys and values the forward returns (HF use_cache):
                                held by the output in evaluation */
    uint64_t cache_unit;     /* its tensors: each key and value, when they are all
                                of this size (0: one tensor); for the allocator
                                simulation */
    uint64_t out_cache_bytes; /* in training (HF use_cache, nothing recomputed):
                                 the cache's copies that no op saves, held by
                                 the output (ml__ck_out_cache) */
    bool fwd_only;           /* it runs forward only: no gradient reaches it (an
                                unused or a frozen vision layer); the replay
                                skips its backward and leaves its saved tensors,
                                if any, to a side tensor */
    bool frozen;             /* a frozen vision tower's (training.vision_tower:
                                frozen): no graph, so nothing saved */
    bool unused_out;         /* its output is not used (a vision layer after the
                                one Llava's projector reads): its saved tensors
                                and output are a side tensor freed with the
                                projector's forward */
    /* its ops' work (work.h): chain work items [work_first, + work_fwd) its
     * forward, then work_bwd of its backward; work_known: listed from its
     * op graph (else the step-time model times it by its FLOPs) */
    uint32_t work_fwd, work_bwd;
    bool work_known;
    bool grads_in_fwd;       /* its forward computes its input's gradient (in_bytes)
                                and its parameters' (grad_bytes), as logits: fused's
                                linear-cross-entropy does; its backward hands them over */
    bool moe;                /* a layer with routed experts (not DeepSeek's first
                                dense layers) */
    bool hand_last;          /* the gradient it hands to the block before is made
                                last, once its saved tensors and all its units but
                                the last are released (autocast's cross-entropy:
                                the .float() cast's backward runs after
                                log_softmax's); for the allocator simulation */
    uint32_t fstep_first, nfsteps; /* its forward without grad as allocations and
                                      frees (ml_fstep, chain.fsteps), when known
                                      (0: the transient ws_nograd, one lump);
                                      for the allocator simulation */
    uint32_t fstep_out;      /* of them, the output's allocation (the next
                                block's input, which the replay makes) */
    uint32_t gstep_first, ngsteps, gstep_out; /* the same for its forward with
                                grad (chain.fsteps too), whose saved tensors'
                                allocations stay (ml_fstep.entry) */
    uint8_t gsave_per;       /* the most allocations one saved entry has */
    uint8_t nfcopies;        /* of its steps without grad, the allocations of
                                autocast's weight copies (ml_fstep.entry 0 ..
                                nfcopies - 1), which stay to the region's end */
    uint16_t hand_gid;       /* a node list's: 1 + the gradient id (ml_bnode's
                                gin_id) of the tensor whose gradient it hands to
                                the block before, 0: none named (then its
                                incoming gradient, passed on) */
} ml_cblock;

typedef struct {
    uint64_t numel, rows, cols; /* rows/cols: last two dims for matrices, 0 for vectors */
    bool nograd;                /* gets no gradient (an unused vision layer's):
                                   torch.optim makes no state for it */
    bool frozen;                /* and needs none (requires_grad False: a frozen
                                   tower's): no state, master copy or gradient
                                   buffer under ZeRO either */
    bool shared;                /* a pipeline's shared embedding (tied embeddings split
                                   over stages): a bucket of its own in Megatron's
                                   buffers (dist_optimizer.c) */
} ml_ptensor;

/* A tensor beside the stream of blocks (docs/ledger.md, "Side tensors"):
 * made by block `from`'s forward, freed once block `to`'s forward ends or,
 * with to_bwd, once its backward ends (something saved it); with
 * ckpt_kept (an argument of the checkpointed blocks), a checkpointed block
 * after `from`, up to `to`, keeps it until that block's backward. Its
 * gradient (grad bytes; 0: none) exists from the start of block
 * grad_from's backward to the end of block grad_to's. */
typedef struct {
    const char *what;
    uint64_t bytes;
    uint32_t from, to;
    bool to_bwd, ckpt_kept;
    uint64_t grad;
    uint32_t grad_from, grad_to;
    bool graph; /* derived from the op graphs (T5's: chain_graph_t5.c) */
} ml_side;

/* The parameter counts every plan sums (ml__param_sums): all, those that
 * train (not frozen), and of those the ones that get a gradient; overflow
 * when a sum passed 64 bits (each sum as ml_add leaves it); known once
 * computed. */
typedef struct {
    uint64_t all, trained, with_grad;
    bool overflow, known;
} ml_param_sums;

/* A step of a block's forward (ml__graph_forward_steps): allocates `bytes`
 * (alloc) or frees part `part` of storage tok. With grad, an allocation of
 * a saved storage names the saved entry it fills (index in the block's
 * list) and which of that entry's allocations it is (slot: an entry can be
 * several, bmm's copies of its operands); else entry is ML_FSTEP_UNSAVED. */
#define ML_FSTEP_UNSAVED UINT16_MAX
typedef struct {
    uint64_t bytes;
    uint16_t tok;
    uint8_t part;
    bool alloc;
    uint16_t entry;
    uint8_t slot;
} ml_fstep;

typedef struct {
    ml_cblock *blocks;
    size_t n, cap;
    ml_fstep *fsteps;           /* the blocks' forward steps, ranges by block */
    size_t nfsteps, fstepcap;
    ml_saved *saved;
    size_t nsaved, savedcap;
    ml_ptensor *params;
    size_t nparams, paramcap;
    ml_bnode *nodes;
    size_t nnodes, nodecap;
    bool record_nodes;          /* the builder lists backward nodes for this block */
    bool overflow, nomem;
    bool eval_mode;             /* model.eval() (the evaluation pass): dropout off,
                                   BatchNorm on its running statistics */
    bool selective;             /* checkpoint: selective (the attention core is
                                   dropped in forward) */
    bool grad_held;             /* a pipeline stage before the last: the schedule
                                   holds the gradient it receives until it
                                   receives the next (Megatron's schedules.py,
                                   output_tensor_grad), so the first residual
                                   sum into it is a new tensor (ml_bnode.
                                   into_incoming) */
    bool mask_in_forward;       /* the model's forward holds ckpt_side (its attention
                                   mask, position ids) through its layers: eager
                                   attention (sdpa and flash get no 4-D mask) */
    ml_prec prec;
    uint64_t B, T;
    uint64_t c_tokens, c_width; /* normalisation of c: B*T and D */
    size_t n_ckpt;              /* checkpointable blocks */
    size_t calibrated;          /* blocks with measured inventories */
    double calib_c;
    bool calib_exact;           /* measured at this T and D (else the global fit) */
    const char *calib_note;     /* why a profile did not apply (static text) */
    uint64_t ckpt_side;         /* tensors a checkpoint keeps besides block inputs:
                                   the attention mask passed to every block */
    ml_vision_tower vis_mode;   /* a multimodal model's training.vision_tower; the
                                   tower's layers are checkpoint indices below
                                   mask_ckpt0 */
    uint32_t side_ids;          /* of ckpt_side, the position ids' bytes: a tensor
                                   of its own, made first (ML_T_SIDE); 0: one */
    uint64_t mask_ckpt0;        /* the checkpoint index of the first layer those
                                   masks serve (Llava: the decoder's, after the
                                   vision layers); 0 otherwise */
    /* resident besides the model states (docs/ledger.md, "The batch and the
     * buffers"): the model's input (block 0's input, moved here once the
     * chain is built) and targets; the module buffers */
    uint64_t batch_input, batch_targets;
    uint64_t buffer_bytes;
    ml_side *sides;             /* an encoder-decoder's (chain_t5.c), a multimodal
                                   model's (chain_llava.c) */
    size_t nsides, sidecap;
    /* scratch while building a block */
    uint64_t max_unsaved, max_tensor;
    uint64_t max_param_numel;
    ml_param_sums psum;         /* of params, once the chain is built */
    ml_work_item *work;         /* what each block's ops do to the device (work.h),
                                   blocks' ranges in work_first .. */
    size_t nwork, workcap;
    uint64_t cp;                /* context parallelism's ranks (1: none): T is a
                                   rank's share of the sequence */
    uint64_t cp_kv;             /* with cp > 1: the elements of a rank's keys (or
                                   values) in one layer, B T Hkv dh */
    uint64_t ep;                /* expert parallelism's ranks (1: none) */
    uint64_t ep_rows;           /* with the experts' dispatch: the rows of one MoE
                                   layer the rank's experts take (MLG_R) */
    uint64_t ep_layer_params;   /* with the experts regrouped (ep x etp != tp): one
                                   MoE layer's routed-expert parameters the rank
                                   holds (E / ep experts, F_e / etp wide) */
    uint64_t moe_k;             /* the experts each token is routed to (top-k) */
    uint64_t moe_experts;       /* the routed experts (E) */
    uint64_t etp;               /* expert tensor parallelism's ranks (1: none) */
    uint64_t ep_tp;             /* a mixture of experts' tensor-parallel ranks (1:
                                   none, or no experts): the experts' data-parallel
                                   ranks are dp x cp x tp / (ep x etp) */
    bool ep_dispatch;           /* the experts' dispatch: expert, expert-tensor or
                                   tensor parallelism with experts */
    uint32_t tables_at;         /* 1 + the first rotary layer's index, whose nodes
                                   free the model's rotary tables
                                   (ml__chain_mark_tables); 0: none */
    uint64_t ep_pairs;          /* with the experts' dispatch: the (token, expert)
                                   pairs of one MoE layer the rank sends (MLG_PS) */
    uint64_t ep_self;           /* of them, those its own experts take (they stay) */
    uint64_t tp_parts;          /* a layer's tensor-parallel parts: 2 (the attention,
                                   the MLP), 1 with routed experts (they are not
                                   split by tp), 2 with a shared expert too */
} ml_chain;

/* The same for every training setting the chain refuses for this model
 * (fused logits, above; an encoder-decoder's optimal checkpointing; a
 * target_len without a decoder stack); else ML_OK. */
ml_status ml__chain_refused(const ml_model *m, const ml_training *t, ml_error *err);

/* Tensor parallelism (tensor_parallel.c, docs/parallel.md): ML_RANGE with
 * the reason when one rank of m under t's parallel.tp cannot be planned;
 * a split model with a calibration profile (measured on whole layers);
 * the model one rank runs: m itself, or in *rank (a shallow copy owning
 * nothing) the narrower model of its tensor split and the engine's layer. */
ml_status ml__tp_refused(const ml_model *m, const ml_training *t, ml_error *err);
/* Context parallelism (context_parallel.c, docs/parallel.md): ML_RANGE
 * with the reason when m under t's parallel.cp cannot be planned. */
ml_status ml__cp_refused(const ml_model *m, const ml_training *t, ml_error *err);
/* The ranks a data-parallel collective and a ZeRO shard span: the shard
 * group's data-parallel ranks (ml_training_shard) times the context-parallel
 * ranks, which hold the same parameters (PyTorch's FSDP over torchtitan's
 * dp_shard x cp mesh, Megatron's data-parallel group with context
 * parallelism). */
static inline uint64_t ml__shard_group(const ml_training *t)
{
    return ml_training_shard(t) * ml_training_cp(t);
}
ml_status ml__split_calib_refused(const ml_config *cfg, ml_error *err);
const ml_model *ml__rank_model(const ml_model *m, const ml_config *cfg, ml_model *rank);
/* training.engine: megatron's conditions (tensor_parallel.c): ML_RANGE
 * with the reason when m or t is not what Megatron-core's GPT layer runs. */
ml_status ml__engine_refused(const ml_model *m, const ml_training *t, ml_error *err);
/* The bytes one rank sends per iteration in the tensor-parallel
 * collectives (docs/parallel.md), the layers checkpointed where seg[k] >=
 * 0 (seg NULL: none). */
double ml__tp_communication(const ml_chain *ch, const ml_training *t, const int *seg,
                            double *allreduces, double *halves);
/* The layers' blocks of a chain (checkpointable: ckpt_index >= 0, as the
 * pipeline's slicer counts them), only those with routed experts when moe
 * (DeepSeek's first layers are dense), and those recomputed (seg[k] >= 0;
 * seg NULL: none): what the collectives of tensor, context and expert
 * parallelism count. */
void ml__chain_layers(const ml_chain *ch, const int *seg, bool moe, double *layers,
                      double *recomputed);
/* Expert parallelism (expert_parallel.c, docs/parallel.md): ML_RANGE with
 * the reason when m under t's parallel.ep and parallel.etp (and tp) cannot
 * be planned. */
ml_status ml__ep_refused(const ml_model *m, const ml_training *t, ml_error *err);
/* Whether m's experts go through Megatron-core's dispatch under t: expert,
 * expert-tensor or tensor parallelism with a mixture of experts. */
bool ml__ep_dispatched(const ml_model *m, const ml_training *t);
/* Its all-to-alls' bytes a rank sends per iteration (their calls in
 * *calls), the layers recomputed where seg[k] >= 0 (seg NULL: none). */
double ml__ep_communication(const ml_chain *ch, const ml_training *t, const int *seg,
                            double *calls);
/* The same for the expert-tensor ranks' all-gathers and reduce-scatters. */
double ml__etp_communication(const ml_chain *ch, const ml_training *t, const int *seg,
                             double *calls);
/* The ranks of N data-parallel ones (of a shard group) that hold the same
 * experts: N tp / (ep etp); N when the experts are not regrouped. */
uint64_t ml__ep_ranks(const ml_chain *ch, uint64_t N);
/* The routed-expert parameters of the rank's chain (0 without ep). */
uint64_t ml__ep_expert_params(const ml_chain *ch);
/* What a data-parallel collective of `per` bytes a parameter (its
 * gradient's or its own), sending `times` its (N - 1)/N, sends less under
 * expert parallelism: the rank's experts' go over the dp x cp / ep ranks
 * holding the same experts, not all dp x cp (0 without ep). */
double ml__ep_saving(const ml_chain *ch, const ml_training *t, double times, double per);
/* A shard of `all` bytes of which `experts` are the routed experts': the
 * experts' over the dp x cp / ep ranks holding them, the rest over dp x cp
 * (ml__shard_group); all / N rounded up without ep. */
uint64_t ml__ep_shard(const ml_chain *ch, const ml_training *t, uint64_t all, uint64_t experts);
/* Block b's gradient partition under ZeRO 2 over N ranks: its experts'
 * over N / ep, the rest over N (all / N rounded up without ep). */
uint64_t ml__ep_grad_shard(const ml_chain *ch, const ml_cblock *b, uint64_t N);
/* What a ring collective over N ranks of block b's `all` bytes, `per` a
 * parameter, sends: (n - 1)/n of each part, its experts' over N / ep
 * ranks, the rest over N. */
double ml__ep_ring(const ml_chain *ch, const ml_cblock *b, uint64_t N, double all,
                   unsigned per);
/* The same for context parallelism's ring (context_parallel.c), with its
 * all-gathers and sends per iteration. */
double ml__cp_communication(const ml_chain *ch, const ml_training *t, const int *seg,
                            double *halves, double *sends);

/* Pipeline parallelism (pipeline.c, docs/parallel.md): ML_RANGE with the
 * reason when m's stages under t cannot be planned; the micro-batches
 * whose activations stage r holds at its peak under t's schedule; stage
 * r's layers (without virtual stages); stage r's chain sliced from the
 * whole model's (out owns its arrays: ml__chain_free). */
ml_status ml__pp_refused(const ml_model *m, const ml_training *t, ml_error *err);
double ml__pp_in_flight(const ml_training *t, uint64_t r);
/* ... at a later micro-batch's backward, when every gradient exists
 * (1F1B's steady state keeps the count; GPipe's later backwards hold one
 * fewer, and so does a 1F1B stage that never leaves its warmup). */
double ml__pp_in_flight_later(const ml_training *t, uint64_t r);
void ml__pp_stage_layers(const ml_model *m, const ml_training *t, uint64_t r, uint64_t *first,
                         uint64_t *count);
ml_status ml__pp_stage_chain(const ml_chain *full, const ml_model *m, const ml_training *t,
                             uint64_t r, ml_chain *out);

/* Builds the chain; returns ML_OK, ML_RANGE (with err), ML_OVERFLOW or ML_NOMEM. */
ml_status ml__chain_build(const ml_model *m, const ml_config *cfg, ml_chain *ch, ml_error *err);
/* What of cfg the chain is built from, the rest cleared: the training
 * settings but the micro-batch (0), the accumulation, data parallelism and
 * the pipeline (the evaluation's), the checkpoint policy only as
 * selective or not (once ml__chain_refused passed it), and the
 * calibration profile; the checkpoint's list and the pipeline's layers are
 * not written (1 KiB each, in no key). Equal keys (ml__chain_key_equal:
 * their bytes but those two lists) give chains that differ only by the
 * micro-batch (the prepared planner's settings, planner.c). */
void ml__chain_key(const ml_config *cfg, ml_config *key);
/* The checkpoint policy as the chain reads it, in place: selective or not
 * (the plan's segments say the rest); its list is not written. */
void ml__chain_policy(ml_checkpoint *c);
bool ml__chain_key_equal(const ml_config *a, const ml_config *b);
/* The same for the evaluation pass: the model in eval mode (eval_mode). */
ml_status ml__chain_build_eval(const ml_model *m, const ml_config *cfg, ml_chain *ch,
                               ml_error *err);
void ml__chain_free(ml_chain *ch);
/* The bytes an element of the keys and values a Hugging Face decoder's
 * DynamicCache holds: the keys' dtype (chain_transformer.c). */
unsigned ml__kv_cache_bpe(const ml_chain *ch, const ml_model *m);
/* Sets each block's like_prev (replay_runs.c). */
void ml__chain_mark_runs(ml_chain *ch);
/* Keeps each node list's rotary-table marks (ml_bnode.frees_table) at the
 * last node of each table, and sets tables_at (chain.c). */
void ml__chain_mark_tables(ml_chain *ch);

/* Optimizer model (optim.c): resident state bytes and step temporaries. */
typedef struct {
    uint64_t states;
    uint64_t step_temp;
    unsigned state_tensors;  /* state tensors per parameter tensor (Adam: exp_avg and
                                exp_avg_sq), for the allocator simulation */
    bool temp_per_tensor;    /* the step's temporaries are one per parameter tensor
                                (foreach), not one at a time (for-loop) */
} ml_optim_bytes;
ml_status ml__optim_bytes_of(const ml_chain *ch, const ml_training *t, ml_optim_bytes *out,
                             ml_error *err);

/* Checked arithmetic with a sticky overflow flag on the chain (0 after an
 * overflow). */
static inline uint64_t ml_mul(ml_chain *ch, uint64_t a, uint64_t b)
{
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r)) {
        ch->overflow = true;
        return 0;
    }
    return r;
}

static inline uint64_t ml_add(ml_chain *ch, uint64_t a, uint64_t b)
{
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r)) {
        ch->overflow = true;
        return 0;
    }
    return r;
}

/* ch's parameter sums: the ones its build stored, else summed now; an
 * overflow in them sets ch->overflow (chain.c) */
ml_param_sums ml__param_sums(ml_chain *ch);

#endif
