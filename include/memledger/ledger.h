/* memledger — the memory ledger of one steady-state training iteration.
 *
 * ml_ledger_evaluate() builds the model's chain of blocks for a config,
 * schedules forward, loss, backward (with recompute when checkpointed) and
 * the optimizer step, and replays that schedule as allocation/free events per
 * category. All byte counts are exact 64-bit integers; FLOPs are doubles. The
 * rules are derived in docs/ledger.md. */
#ifndef MEMLEDGER_LEDGER_H
#define MEMLEDGER_LEDGER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "export.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ml_category {
    ML_CAT_PARAMS,      /* working parameters */
    ML_CAT_MASTER,      /* fp32 master weights (bf16-master/fp16-master) */
    ML_CAT_GRADS,       /* parameter gradients */
    ML_CAT_OPTIMIZER,   /* optimizer states */
    ML_CAT_ACTIVATIONS, /* tensors saved for backward (and checkpoint inputs) */
    ML_CAT_RECOMPUTE,   /* saved tensors recomputed during backward */
    ML_CAT_WORKSPACE,   /* transients: intermediates, gradient buffers, step temporaries */
    ML_CAT_BATCH,       /* the batch the training loop holds: inputs and targets */
    ML_CAT_BUFFERS,     /* module buffers: BatchNorm statistics, rotary inv_freq, masks */
    ML_CAT_COUNT
} ml_category;

typedef enum ml_phase {
    ML_PHASE_FORWARD,
    ML_PHASE_LOSS,
    ML_PHASE_BACKWARD,
    ML_PHASE_OPTIMIZER,
    ML_PHASE_COUNT
} ml_phase;

/* "params", "master_params", "grads", "optimizer_states",
 * "activations_saved", "recompute", "workspace". */
ML_API const char *ml_category_name(ml_category c);
/* "forward", "loss", "backward", "optimizer". */
ML_API const char *ml_phase_name(ml_phase p);

/* How a block's forward transients (what its forward holds beside its saved
 * tensors while it runs, with grad and under no_grad) were found
 * (docs/ledger.md, "Transients"). */
typedef enum ml_transients {
    ML_TRANSIENTS_OPS,        /* its forward op by op, with grad and under no_grad */
    ML_TRANSIENTS_BLOCK_RULE, /* the block rule: twice its largest tensor (a layout
                                 whose forward is not walked op by op: autocast
                                 outside GPT-2's, Llama's and ViT's layouts,
                                 fused attention, a parallel residual with
                                 dropout, latent attention, experts, a vision
                                 tower, T5) */
    ML_TRANSIENTS_PARTLY,     /* op by op in one of the two, the block rule in the
                                 other (selective checkpointing, a calibration
                                 profile's inventory other than the graph's:
                                 with grad) */
    ML_TRANSIENTS_FORMULA,    /* the block's own tensors (the loss: the logits'
                                 fp32 copy, the fused cross-entropy's chunks) */
    ML_TRANSIENTS_COUNT
} ml_transients;
/* "ops", "block_rule", "partly", "formula" (JSON: blocks[].transients). */
ML_API const char *ml_transients_name(ml_transients t);

typedef struct ml_block_info {
    char name[48];              /* "embedding", "block.3", "head", "loss", "2:conv2d" */
    uint64_t params;            /* parameters owned by the block (elements) */
    uint64_t activations_saved; /* bytes it keeps at the end of forward (plan applied) */
    uint64_t inventory_bytes;   /* bytes it would keep without checkpointing */
    double c;                   /* inventory_bytes / (B*T*D*b), docs/ledger.md */
    double flops_forward;       /* per micro-batch */
    bool checkpointed;          /* inside a checkpoint segment */
    int32_t segment;            /* the segment's id (blocks with the same id are
                                   recomputed together), -1 when not checkpointed */
    int32_t ckpt_index;         /* index in checkpoint lists, -1 for embedding/head/loss */
    bool measured;              /* inventory from a calibration profile */
    bool frozen;                /* a frozen vision tower's block (training.vision_tower:
                                   frozen): it runs forward only and saves nothing */
    bool unused_output;         /* a layer whose output nothing reads (a multimodal
                                   model's vision layers after the one its projector
                                   reads): it runs forward only, its saved tensors
                                   freed once the image features are made; its
                                   activations_saved is what is kept for the backward
                                   (its input, when the projector saves that) */
    ml_transients transients;   /* how its forward's transients were found */
    bool backward_nodes;        /* its backward replayed per autograd node, each
                                   node's tensors in PyTorch's order (docs/ledger.md,
                                   "Backward, node by node"); false: by the block
                                   rule, or none (a frozen or unused block runs
                                   forward only) */
} ml_block_info;

/* One pipeline stage's figures (docs/parallel.md): a plan with
 * parallel.pp above 1 is its fullest stage's, and lists every stage. */
typedef struct ml_rank_info {
    uint32_t stage;
    uint32_t first_layer, layers; /* its layers: [first_layer, + layers) (with
                                     virtual stages, first_layer is its first
                                     chunk's and layers counts all of them) */
    bool embedding, head;         /* it runs the embedding (the first stage), the
                                     head and the loss (the last) */
    uint64_t params;              /* elements */
    double in_flight;             /* micro-batches whose activations it holds at
                                     its peak (the schedule's) */
    uint64_t activations_saved;   /* one micro-batch's, at the end of its forward */
    uint64_t peak;                /* the allocator view's, with the in-flight ones */
    bool has_reserved;
    uint64_t reserved;            /* the caching allocator's simulated peak */
    uint64_t device_total;        /* the figure held against the device */
    bool has_device, fits;
    int64_t headroom;
    double p2p_bytes;             /* activations and gradients it sends to the
                                     stages beside it per iteration */
    double micro_s;               /* its forward, backward and recompute per
                                     micro-batch (the step-time model's); < 0
                                     unknown */
    /* its model states (ml_summary's bytes_params, bytes_master, bytes_grads,
     * bytes_optimizer for this stage) */
    uint64_t bytes_params, bytes_master, bytes_grads, bytes_optimizer;
    double p2p_sends;             /* the sends of p2p_bytes per iteration (each its
                                     latency, docs/search.md) */
} ml_rank_info;

typedef struct ml_event {
    ml_phase phase;
    int32_t block;       /* block index, -1 for the optimizer step */
    uint32_t micro;      /* 0: first micro-batch, 1: a later one */
    ml_category cat;
    int64_t delta;       /* bytes allocated (>0) or freed (<0) */
    uint64_t live[ML_CAT_COUNT];
    /* when (docs/ledger.md, "Time"): the FLOPs the iteration has run
     * before this event (forward, recompute and backward of the blocks,
     * the middle micro-batches of an accumulation included), and that as
     * seconds at the step time's throughput; t_s < 0 when no throughput is
     * known (no --peak-tflops and no profile). t_s adds the communication
     * and host transfers before the event when their bandwidths are given
     * (device.interconnect_gbps, device.pcie_gbps), run serially: no overlap
     * with compute (docs/sharding.md, "Time") */
    double flops_before;
    double t_s;
    double comm_before;  /* bytes this device sent over the interconnect before it */
    double host_before;  /* bytes it moved over the host link before it (offload) */
} ml_event;

/* Which of the iteration's peaks the verdict uses: the largest. */
typedef enum ml_peak_kind {
    ML_PEAK_STEADY,          /* a steady-state iteration (`peak`) */
    ML_PEAK_FIRST_ITERATION, /* the first: optimizer states created by its step() */
    ML_PEAK_EVAL,            /* the evaluation pass (training.eval_batch) */
    ML_PEAK_KIND_COUNT
} ml_peak_kind;

/* "steady", "first_iteration", "eval". */
ML_API const char *ml_peak_kind_name(ml_peak_kind k);

/* One phase's allocator peak (docs/ledger.md, "Each phase's peak"). */
typedef struct ml_phase_peak {
    bool present;                    /* false: the phase allocates nothing */
    uint64_t peak;                   /* the most live bytes during it */
    int32_t block;                   /* where: the block, -1 before the first
                                        block's forward or in the optimizer step */
    char at[64];                     /* its name as peak_step: "block.3",
                                        "block.3 (recompute)", "resident",
                                        "optimizer.step" */
} ml_phase_peak;

/* Where the simulated allocator's reserved bytes peaked (device.allocator
 * caching or expandable; docs/allocator.md, "Where the reserved peak is"). */
typedef enum ml_reserved_when {
    ML_RESERVED_RESIDENT,  /* while the parameters (and master weights) are made */
    ML_RESERVED_FIRST,     /* in the first iteration (its step makes the states) */
    ML_RESERVED_STEADY,    /* in a steady iteration */
    ML_RESERVED_EVAL       /* in the evaluation pass */
} ml_reserved_when;

typedef struct ml_reserved_at {
    ml_reserved_when when;
    ml_phase phase;       /* the phase of the allocation that reached it */
    int32_t block;        /* its block, -1 outside the blocks */
    char at[64];          /* as peak_step: "block.3", "loss", "optimizer.step",
                             "resident", "evaluation" */
    uint64_t allocated;   /* bytes allocated in the segments then (rounded, as
                             torch.cuda.memory_allocated()) */
    uint64_t segments;    /* segments then */
} ml_reserved_at;

/* The per-op step-time model (docs/time.md): each op of each block timed
 * on the GPU as the slower of its FLOPs at the rate of its kind and shape
 * and its bytes at the memory bandwidth its kernel class achieves, at
 * least a kernel's floor; each op dispatched by the host at a cost per
 * kernel; the two run as a pipeline (a kernel starts once the GPU is free
 * and the host has issued it). */
typedef enum {
    ML_TIME_NONE,       /* not timed: the device's rates are unknown */
    ML_TIME_DATASHEET,  /* the device's datasheet figures, derated */
    ML_TIME_CALIBRATED, /* the GEMM rates of a calibration profile */
} ml_time_source;

typedef enum {
    ML_TPHASE_FORWARD,
    ML_TPHASE_BACKWARD,
    ML_TPHASE_RECOMPUTE,
    ML_TPHASE_STEP,
    ML_TPHASE_COUNT
} ml_time_phase;

typedef struct ml_step_time {
    ml_time_source source;
    double step_s;       /* one iteration, all micro-batches: the pipeline of
                            GPU and host, plus communication and host
                            transfers; the summary's step_time_s is this one
                            when the step is timed (source not NONE) */
    double flops_s;      /* the FLOPs alone at the peak x efficiency (or the
                            profile's measured rate): a lower bound on the
                            compute; < 0 unknown */
    double gpu_s;        /* the GPU's busy time */
    double host_s;       /* the host's dispatch time */
    bool host_bound;     /* host_s > gpu_s */
    double by_phase[ML_TPHASE_COUNT]; /* step_s's compute part, by phase */
    double gemm_s;       /* GPU time of matrix products and fused attention */
    double memory_s;     /* GPU time of the memory-bound ops */
    double floor_s;      /* GPU time where the kernel floor binds */
    double tokens_per_s; /* micro-batch x tokens x accumulation / step_s */
    double mfu;          /* (forward + backward FLOPs) / step_s / the datasheet
                            peak; < 0 without one */
    size_t flops_only_blocks; /* blocks without an op graph: timed by FLOPs */
    double kernels[ML_TPHASE_COUNT]; /* kernels launched per iteration, by phase */
    double recomputed_blocks; /* block recomputations per iteration */
    bool serial;         /* one processor (a CPU profile's): the host's time
                            and the compute's add up, nothing overlaps */
} ml_step_time;

typedef struct ml_summary {
    uint64_t params;                 /* parameter count */
    /* resident and end-of-forward bytes */
    uint64_t bytes_params;
    uint64_t bytes_master;
    uint64_t bytes_grads;            /* all gradients, once allocated */
    uint64_t bytes_optimizer;
    uint64_t bytes_activations;      /* saved at the end of forward */
    uint64_t bytes_step_temp;        /* optimizer step temporaries at their peak */
    /* sharding and offload (docs/sharding.md): the figures above are per
     * device; what was moved to the host is counted here */
    uint64_t bytes_host;             /* offloaded states, master weights, params, grads */
    double comm_bytes;               /* bytes each device sends per iteration */
    double tp_comm_bytes;            /* of those, besides: bytes each rank sends in the
                                        tensor-parallel collectives inside the layers
                                        (docs/parallel.md; 0 without parallel.tp) */
    double host_transfer_bytes;      /* bytes over the host link per iteration, per
                                        device (offload; 0 without) */
    /* the checkpoint plan as run: "none", "every-2", "optimal: [0-3] [8]" */
    char plan[256];
    bool plan_fits_budget;           /* optimal: false when no plan met the budget */
    /* calibration (cfg->calib): what was measured rather than derived */
    size_t calibrated_blocks;        /* blocks whose saved bytes come from the profile */
    double calibrated_c;             /* the measured c applied to them */
    bool calibrated_at_shape;        /* measured at this T and D; else extrapolated by the fit */
    const char *calibration_note;    /* why the profile's c was not applied (static text);
                                        NULL when it was, or without a profile */
    bool time_measured;              /* step time from the profile's achieved TFLOP/s */
    /* the peak of the allocator view */
    uint64_t peak;
    ml_phase peak_phase;
    int32_t peak_block;              /* -1: optimizer step */
    char peak_step[64];              /* "block.3", "head", "optimizer.step" */
    uint64_t peak_breakdown[ML_CAT_COUNT];
    uint64_t category_max[ML_CAT_COUNT];
    uint64_t runtime_reserve;
    uint64_t fragmentation;          /* peak x device.fragmentation, to the byte */
    uint64_t peak_total;             /* peak + fragmentation + runtime_reserve */
    uint64_t device_limit;           /* ml_device_limit: the allocator peak the device admits */
    /* FLOPs (doubles) */
    double flops_forward;            /* per iteration (all micro-batches) */
    double flops_backward;
    double flops_recompute;
    double flops_total;
    double flops_per_micro_batch;    /* total / grad_accum */
    double step_time_s;              /* < 0 when the device peak is unknown; else
                                        time_compute_s plus the parts below that
                                        are timed (not overlapped) */
    double time_compute_s;           /* the per-op model's GPU and host pipeline
                                        (time.source not NONE), else FLOPs /
                                        throughput; < 0 unknown */
    double time_communication_s;     /* comm_bytes / device.interconnect_gbps; 0
                                        without communication, < 0 not timed
                                        (no bandwidth given) */
    double time_host_transfer_s;     /* host_transfer_bytes / device.pcie_gbps;
                                        0 without offload, < 0 not timed */
    /* verdict (valid when has_device) */
    bool has_device;
    uint64_t memory;
    uint64_t budget;                 /* line for `peak` */
    bool fits;                       /* peak <= budget and peak_total <= memory */
    int64_t headroom;                /* min(budget - peak, memory - peak_total) */
    /* normalisation used for c: B*T*D*b */
    uint64_t c_tokens;               /* B*T */
    uint64_t c_width;                /* D (hidden or per-sample input width) */
    unsigned c_dtype_bytes;          /* b */
    /* the peaks besides the steady state's (docs/ledger.md, "first iteration
     * and evaluation"); appended, so the fields above keep their offsets */
    uint64_t peak_first_iteration;   /* the first iteration's allocator peak */
    bool has_eval;                   /* an evaluation pass was planned */
    uint64_t peak_eval;              /* its allocator peak (0 without one) */
    ml_peak_kind binding;            /* the largest of the three; peak_total,
                                        fits and headroom are computed from it */
    /* the caching allocator simulated over the first iteration, two steady
     * ones and the evaluation pass (device.allocator; docs/allocator.md) */
    bool has_reserved;
    uint64_t reserved_peak;          /* max_memory_reserved() */
    uint64_t reserved_segments;      /* segments at most (cudaMalloc'd, or expandable) */
    bool reserved_oom;               /* the simulation ran out of the device */
    ml_reserved_at reserved_at;      /* where the reserved peak was (has_reserved) */
    /* the peak the step time used (ml_device_peak; 0 when the time is
     * measured or unknown), and why a profile's measured throughput was
     * not used (static text; NULL when it was, or without one) */
    double peak_tflops_used;
    const char *time_note;
    /* resident besides the model states (docs/ledger.md, "The batch and
     * the buffers"): the micro-batch's inputs and targets the training loop
     * holds, and the model's buffers */
    uint64_t bytes_batch;
    uint64_t bytes_buffers;
    /* each phase's peak, indexed by ml_phase: the steady iteration's (the
     * largest is `peak`), the first iteration's (the largest is
     * peak_first_iteration) and, with has_eval, the evaluation pass's
     * (forward and loss only; the largest is peak_eval) */
    ml_phase_peak phase_steady[ML_PHASE_COUNT];
    ml_phase_peak phase_first[ML_PHASE_COUNT];
    ml_phase_peak phase_eval[ML_PHASE_COUNT];
    /* the step time of the per-op model (ml_step_time) */
    ml_step_time time;
    /* a pipeline (parallel.pp above 1; docs/parallel.md): the step of all
     * its stages, each stage's micro-batches in the schedule's order with
     * the slowest one setting the pace, its optimizer step after, and the
     * share of it the stages wait (the bubble); < 0: no pipeline, or a
     * stage's time unknown. time and step_time_s are this stage's own. */
    double pipeline_step_s;
    double pipeline_bubble;
    /* tp_comm_bytes at device.interconnect_gbps (inside a node), in the step
     * time after the compute; 0 without tensor parallelism, < 0 not timed
     * (no bandwidth) */
    double time_tp_s;
    /* the part of comm_bytes that reduces the gradients (DDP's all-reduce,
     * ZeRO-1's and the distributed optimizer's reduce-scatter, HSDP's
     * all-reduce across the groups); with parallel.overlap_grad_reduce the
     * time of it that the last micro-batch's backward covers, taken off the
     * step (0 without) */
    double comm_grad_bytes;
    double time_comm_hidden_s;
    /* context parallelism's ring (docs/parallel.md): bytes each rank sends per
     * iteration (the keys and values all-gathered in each layer's forward and
     * again in its backward, the key/value gradients passed on), and their
     * time at device.interconnect_gbps in the step, not overlapped; 0 without
     * parallel.cp, time < 0 not timed */
    double cp_comm_bytes;
    double time_cp_s;
    /* the collectives' calls per iteration, each paying a latency beside its
     * bytes (docs/search.md, "Latency"): tensor parallelism's all-reduces and
     * its all-gathers and reduce-scatters; context parallelism's all-gathers
     * and its sends (the ring's permutes); data parallelism's all-reduces and
     * its all-gathers and reduce-scatters (buckets, blocks) */
    double tp_allreduces, tp_halves;
    double cp_halves, cp_sends;
    double dp_allreduces, dp_halves;
    /* expert parallelism's all-to-alls (docs/parallel.md, "Expert
     * parallelism"): bytes each rank sends per iteration (each MoE layer's
     * dispatch and combine in forward, again in backward and in a
     * recomputed forward), their time at device.interconnect_gbps in the
     * step, not overlapped (0 without parallel.ep, time < 0 not timed), and
     * their calls */
    double ep_comm_bytes;
    double time_ep_s;
    double ep_calls;
    /* expert tensor parallelism's all-gathers and reduce-scatters of each
     * MoE layer's rows (docs/parallel.md, "Expert tensor parallelism"):
     * bytes each rank sends per iteration, their time at
     * device.interconnect_gbps, not overlapped (0 without parallel.etp
     * above 1, time < 0 not timed), and their calls */
    double etp_comm_bytes;
    double time_etp_s;
    double etp_calls;
    /* what device.start had reserved and allocated, in how many segments,
     * when the simulation began (docs/allocator.md, "A process that ran
     * something before"); 0 without a start */
    uint64_t start_reserved, start_allocated, start_segments;
    /* max_memory_reserved() once the first iteration has ended, and once
     * the steady iterations have (has_reserved; read as PyTorch reads it
     * after each, without a reset: the cache keeps its segments, so the
     * evaluation's is reserved_peak) */
    uint64_t reserved_first, reserved_steady;
    /* frees the simulation could not match to the tensor the plan names
     * (a node's gradient, a size no live allocation has) and so released
     * by size: a check of the plan's events, 0 on every shipped model
     * (tests/unit/test_grad_identity.c) */
    uint64_t reserved_inexact;
    /* the pass in which the simulation ran out of the device (reserved_oom;
     * appended): while the parameters are made, the first iteration, a
     * steady one, or the evaluation pass, the training's passes then having
     * run whole (their figure reserved_steady) */
    ml_reserved_when reserved_oom_when;
    /* (appended) whether reserved_oom decides the verdict: the simulated
     * cache is weighed, no fragmentation allowance in its place */
    bool reserved_oom_weighed;
} ml_summary;

/* Checks a configuration's values against the planner's limits (sizes,
 * enums, the device's lines); ML_OK, or ML_RANGE with a message naming the
 * key ("training.seq_len: must be between 1 and 268435456").
 * ml_ledger_evaluate checks the same. */
ML_API ml_status ml_config_check(const ml_config *cfg, ml_error *err);
/* The same message, or NULL when the configuration is within the limits. */
ML_API const char *ml_config_problem(const ml_config *cfg);

typedef struct ml_ledger ml_ledger;

/* Evaluates one training iteration. keep_events: also record the event list
 * (ml_ledger_events); without it evaluation allocates nothing per event.
 * On success *out owns a new ledger (ml_ledger_destroy); on failure *out is
 * unchanged. Returns ML_OK, ML_RANGE (bad config value, e.g. micro_batch 0 or
 * a checkpoint list naming a block that does not exist), ML_OVERFLOW or
 * ML_NOMEM. */
ML_API ml_status ml_ledger_evaluate(const ml_model *m, const ml_config *cfg, bool keep_events,
                                    ml_ledger **out, ml_error *err);
/* Accepts NULL. */
ML_API void ml_ledger_destroy(ml_ledger *l);

/* A prepared planner for one model: ml_planner_evaluate gives exactly what
 * ml_ledger_evaluate gives, faster where configurations differ only in
 * training.micro_batch (a search over micro-batches, a grid): it builds
 * the model's chain of blocks once per other setting and derives it for
 * each micro-batch (docs/ledger.md, "A prepared planner"). m must outlive
 * the planner and not change while it lives; one planner per thread. */
typedef struct ml_planner ml_planner;
/* *out owns a new planner (ml_planner_destroy); ML_OK or ML_NOMEM. */
ML_API ml_status ml_planner_create(const ml_model *m, ml_planner **out, ml_error *err);
/* As ml_ledger_evaluate(m, cfg, keep_events, out, err) for the planner's m. */
ML_API ml_status ml_planner_evaluate(ml_planner *p, const ml_config *cfg, bool keep_events,
                                     ml_ledger **out, ml_error *err);
/* Accepts NULL. */
ML_API void ml_planner_destroy(ml_planner *p);

ML_API const ml_summary *ml_ledger_summary(const ml_ledger *l);
/* The allocator peak that binds (s->binding): the steady, first-iteration
 * or evaluation peak, the one the device total is made from. */
ML_API uint64_t ml_summary_binding_peak(const ml_summary *s);
/* The figure its budget line holds: with the allocator simulated the
 * reserved peak (or, with device.fragmentation, the allowance's estimate
 * of it), peak_total less the runtime reserve; else the binding peak. */
ML_API uint64_t ml_summary_budget_figure(const ml_summary *s);
/* The iteration's step time: with a pipeline the pipeline's step
 * (pipeline_step_s: its fullest stage's work, the bubble and the step), else
 * step_time_s; < 0 when not timed. What compare's, fit's and the advice's
 * step times are (step_time_s alone is a stage's own work). */
ML_API double ml_summary_step_time(const ml_summary *s);
ML_API size_t ml_ledger_block_count(const ml_ledger *l);
/* Pipeline stages (parallel.pp above 1; 0 without): each stage's figures,
 * and the index of the fullest, whose plan the ledger is. */
ML_API size_t ml_ledger_rank_count(const ml_ledger *l);
ML_API const ml_rank_info *ml_ledger_rank(const ml_ledger *l, size_t i);
ML_API size_t ml_ledger_worst_rank(const ml_ledger *l);
ML_API const ml_block_info *ml_ledger_block(const ml_ledger *l, size_t i);
/* Empty unless evaluated with keep_events. */
ML_API size_t ml_ledger_event_count(const ml_ledger *l);
ML_API const ml_event *ml_ledger_events(const ml_ledger *l);

/* The allocator simulation's own events (device.allocator caching or
 * expandable): each tensor PyTorch would allocate or free as the
 * simulation replays the plan's aggregates (docs/allocator.md, "On the
 * plan"), the trace `memledger allocator` reads (timeline --format trace),
 * with a mark where each pass starts. A simulation that ran out of the
 * device (ml_summary.reserved_oom) ends with the request it refused, an
 * allocation of id 1 (no granted allocation's id), and no pass after it.
 * Evaluated with keep_events and the simulation (with a pipeline, the
 * worst stage's); else empty. The array is the ledger's, valid until
 * ml_ledger_destroy. */
typedef enum ml_sim_action { ML_SIM_ALLOC, ML_SIM_FREE, ML_SIM_MARK } ml_sim_action;
typedef struct ml_sim_event {
    ml_sim_action action;
    ml_reserved_when when; /* a mark: the pass it starts */
    bool second;           /* a mark: the second steady iteration's */
    uint64_t id;           /* an allocation's name while it lives (reused after
                              its free) */
    uint64_t bytes;        /* an allocation's requested bytes (0 on a free) */
} ml_sim_event;
ML_API size_t ml_ledger_sim_event_count(const ml_ledger *l);
ML_API const ml_sim_event *ml_ledger_sim_events(const ml_ledger *l);

/* One point of the live-bytes curve: the total live bytes (all categories)
 * from t_s seconds into the iteration until the next point's t_s. */
typedef struct ml_curve_point {
    double t_s;
    uint64_t bytes;
} ml_curve_point;

/* The memory curve of one iteration as (t, bytes) points of a step function
 * (docs/ledger.md, "Time"): the events in order, each run of events at the
 * same instant collapsed to its highest total, then, when lower, the total
 * after its last event; so a spike of zero width (the optimizer step's
 * temporaries, an op's workspace) keeps its true height as a vertical
 * segment, and the highest point is the summary's peak. Writes at most cap
 * points (points may be NULL when cap is 0) and returns how many the whole
 * curve has, so a caller can size the array with a first call. Returns 0
 * when the ledger kept no events or its events have no time (no
 * throughput: every t_s < 0). Allocates nothing; never fails. */
ML_API size_t ml_ledger_curve(const ml_ledger *l, ml_curve_point *points, size_t cap);

/* An inference job (docs/colocate.md, "Inference jobs"): the evaluation
 * pass's forward (model.eval() under torch.no_grad(); docs/ledger.md,
 * "First iteration and evaluation") at cfg's training.micro_batch and
 * training.seq_len, holding only what inference holds: the parameters in the
 * precision policy's working dtype and the buffers; no master weights,
 * gradients, optimizer states or training batch. With generate > 0, a
 * decoder generating that many tokens: the KV cache of seq_len + generate
 * tokens. Bytes. */
typedef struct ml_inference {
    uint64_t batch, seq_len, generate;
    uint64_t weights;         /* the parameters (working dtype) */
    uint64_t forward_peak;    /* the no-grad forward's allocator peak, weights,
                                 buffers, batch and output included */
    uint64_t kv_forward;      /* the cache the forward's output already holds
                                 (Hugging Face use_cache: seq_len tokens);
                                 part of forward_peak */
    uint64_t kv_cache;        /* generate > 0: 2 x layers x batch x kv_heads x
                                 head_dim x (seq_len + generate) x the keys'
                                 bytes (the compute dtype's; 4 for a rotary
                                 model under autocast); 0 without */
    uint64_t peak;            /* the allocator peak: forward_peak, or with
                                 generate forward_peak - kv_forward + kv_cache */
    uint64_t fragmentation;   /* peak x device.fragmentation, to the byte */
    uint64_t runtime_reserve; /* device.runtime_reserve: its own process */
    uint64_t peak_total;      /* peak + fragmentation + runtime_reserve */
} ml_inference;

/* Plans an inference job of m under cfg (its micro_batch and seq_len; the
 * training settings are ignored: optimizer, ZeRO, offload, data parallel,
 * checkpointing, the evaluation pass, a simulated allocator). On success
 * writes *out; on failure leaves it unchanged. Returns ML_OK, ML_RANGE (a
 * configuration value; generate on a model that is not a decoder, or past
 * its max_positions or sliding_window; the message says which), ML_OVERFLOW
 * or ML_NOMEM. */
ML_API ml_status ml_inference_evaluate(const ml_model *m, const ml_config *cfg,
                                       uint64_t generate, ml_inference *out, ml_error *err);

#ifdef __cplusplus
}
#endif
#endif
