/* memledger — decisions on top of the ledger: the largest micro-batch and
 * the accumulation steps for a target batch (fit), and checkpoint policies
 * side by side (compare). docs/choosing.md walks through both. */
#ifndef MEMLEDGER_PLAN_H
#define MEMLEDGER_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "export.h"
#include "ledger.h"
#include "lengths.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ml_fit_request {
    uint64_t global_batch;    /* target effective batch; 0 = none */
    uint64_t max_micro_batch; /* upper end of the search (default 65536) */
    bool auto_checkpoint;     /* pick the policy (docs/choosing.md); else cfg's */
} ml_fit_request;

ML_API ml_fit_request ml_fit_request_defaults(void);

typedef struct ml_fit_result {
    bool fits;                  /* some micro-batch >= 1 fits */
    uint64_t micro_batch;       /* chosen */
    uint64_t grad_accum;
    uint64_t data_parallel;
    uint64_t effective_batch;   /* micro_batch * grad_accum * data_parallel */
    uint64_t max_micro_batch;   /* the largest that fits (before divisibility) */
    bool exact;                 /* effective_batch == global_batch (true without one) */
    ml_checkpoint checkpoint;   /* the policy used */
    char plan[256];             /* the plan as run ("optimal: [0-3]" ...) */
    uint64_t peak_total;        /* at the chosen micro-batch */
    uint64_t budget;
    int64_t headroom;
    double flops_recompute;     /* per iteration at the chosen point */
    uint64_t peak;              /* allocator peak (peak_total less the runtime reserve) */
    double step_time_s;         /* < 0 when unknown */
    unsigned evaluations;       /* ledger evaluations the search made */
    char note[512];             /* why the choice, or why nothing fits */
    bool at_search_limit;       /* max_micro_batch is the search's upper end
                                 * (req.max_micro_batch): larger may fit too */
    bool at_global_batch;       /* max_micro_batch is the global batch per device
                                 * (req.global_batch / data_parallel, rounded up),
                                 * where the search stops: it fits whole, and a
                                 * larger one, which may fit too, would not be used */
} ml_fit_result;

/* Finds the largest micro-batch whose peak fits the device (cfg->device must
 * be present) and the accumulation steps reaching req->global_batch. The
 * search is exact on the ledger (bisection; the peak is monotone in the
 * micro-batch for a fixed plan). Returns ML_OK with out->fits false and a
 * note when even micro-batch 1 does not fit; ML_USAGE without a device;
 * ML_RANGE, ML_OVERFLOW, ML_NOMEM as ml_ledger_evaluate. */
ML_API ml_status ml_fit(const ml_model *m, const ml_config *cfg, const ml_fit_request *req,
                        ml_fit_result *out, ml_error *err);

/* The layout search (docs/search.md): N devices
 * split as tensor x pipeline x data parallelism, each layout's micro-batch
 * and checkpoint policy, ranked by the step time of those that fit every
 * rank. */
struct ml_layout_row;

typedef struct ml_layout_request {
    uint64_t gpus;          /* devices in all */
    uint64_t gpus_per_node; /* tensor parallelism stays within a node (default 8) */
    uint64_t global_batch;  /* samples a step */
    double network_gbps;    /* busbw between nodes; 0: the device preset's network
                               (ml_device_network), else its interconnect */
    /* called after each layout (NULL: none): layouts done and in all, and
     * the fastest the table holds so far (NULL before one is kept: the
     * table's rows are planned as configured a pool at a time) */
    void (*progress)(void *ctx, uint64_t done, uint64_t total, const struct ml_layout_row *best);
    void *progress_ctx;
    /* parts pinned rather than searched (0, false: searched): the tensor-
     * parallel size, the pipeline stages, the micro-batch, the checkpoint
     * policy (else none, selective and full) */
    uint64_t tp, pp, micro_batch;
    bool pin_checkpoint;
    ml_checkpoint checkpoint;
    /* the data-parallel sharding as the config has it (its training.zero or
     * parallel.dist_optimizer), not searched; else the search tries ZeRO
     * stages 0 to 3 (eager PyTorch; 0 and 1 with a pipeline) or the
     * distributed optimizer off and on (engine megatron) whenever dp > 1 */
    bool pin_sharding;
    uint64_t vpp; /* virtual stages pinned (1: none); 0: searched */
    uint64_t cp;  /* context-parallel ranks pinned (1: none); 0: searched (within a
                     node beside tp, where the model's attention can run the ring) */
    bool no_selective; /* an unpinned policy is none or full only (settings for an
                          engine without the attention core's recompute: torchtitan) */
    uint64_t ep;  /* expert-parallel ranks pinned (1: none); 0: searched (a mixture of
                     experts': each size dividing the experts and dp x cp, beside ZeRO,
                     not the distributed optimizer) */
    bool exhaustive; /* plan every point the memory pruning leaves; else a point
                        whose step time is bounded below by a planned one's
                        (the same layout and micro-batch without recomputation:
                        recomputation only adds work) and the bound is slower
                        than the table's last row is passed over (the table is
                        the same either way) */
    bool megatron_sharding; /* an unpinned sharding is one Megatron-LM runs (settings
                               for it): ZeRO 0 or 1 (its distributed optimizer) for
                               eager PyTorch's layers, not 2 or 3 */
    bool fsdp_sharding; /* the pinned ZeRO 3 is torchtitan's FSDP (settings for it),
                           which runs beside a pipeline: tried on every layout, where a
                           pinned ZeRO stage is otherwise tried over more than one
                           data-parallel rank, 2 and 3 without a pipeline */
} ml_layout_request;

ML_API ml_layout_request ml_layout_request_defaults(void);

typedef struct ml_layout_row {
    uint64_t tp, pp, dp;        /* the layout (sequence parallelism with tp > 1; 1F1B) */
    uint64_t micro_batch, micro_batches; /* a step: micro_batches per data-parallel rank */
    ml_checkpoint checkpoint;   /* none, selective or full */
    uint64_t peak;              /* the fullest rank's allocator peak */
    uint64_t device_total;      /* its figure against the device */
    int64_t headroom;
    double compute_s;           /* the pipeline's step (a stage's work without one) */
    double comm_s;              /* the tensor-, context- and expert-parallel, pipeline and
                                   data-parallel transfers at the bandwidths with each
                                   call's latency, not overlapped; < 0 untimed (no
                                   bandwidth) */
    double step_s;              /* compute_s + comm_s (compute_s alone when untimed) */
    double bubble;              /* the pipeline's bubble share (0 without one) */
    double tokens_per_s;        /* global batch x tokens / step_s */
    double mfu;                 /* FLOPs of all devices / step_s / their peak; < 0 unknown */
    uint64_t vpp;               /* virtual stages a stage (interleaved 1F1B when > 1) */
    unsigned zero;              /* the ZeRO stage over the data-parallel ranks */
    bool dist_optimizer;        /* Megatron's distributed optimizer */
    uint64_t cp;                /* context-parallel ranks (0 or 1: none) */
    double latency_s;           /* of comm_s, the collectives' and sends' latency
                                   (NCCL's, per call: docs/search.md, "Latency") */
    uint32_t first_layers, middle_layers, last_layers; /* an uneven split
                                   (Megatron's --decoder-first/last-pipeline-num-layers):
                                   the first stage's layers, each middle one's, the
                                   last's; 0: the even split */
    uint64_t ep;                /* expert-parallel ranks (0 or 1: none) */
    uint64_t etp;               /* a mixture of experts' expert-tensor ranks; 0: the
                                   configuration's (tp's by default) */
} ml_layout_row;

#define ML_LAYOUT_TOP 10

typedef struct ml_layout_result {
    ml_layout_row rows[ML_LAYOUT_TOP]; /* the fastest fitting, fastest first */
    size_t nrows;
    uint64_t layouts;       /* (tp, pp, dp) splits tried */
    uint64_t evaluations;   /* plans made */
    uint64_t fitting;       /* (layout, micro-batch, policy) points planned that fit
                               in the allocated view; each as fast as the
                               table's last row is planned again as configured
                               (the caching allocator's reserved peak) for the
                               rows */
    bool comm_timed;        /* a bandwidth was given */
    char note[512];         /* what was searched, or why nothing fits */
    uint64_t candidates;    /* (layout, micro-batch, policy) points in the space, each
                               planned or left out by the memory pruning (a
                               micro-batch above one that does not fit) */
    uint64_t passed_over;   /* candidates not planned: their step-time bound was
                               slower than the table's last row (exhaustive off) */
} ml_layout_result;

/* The settings of a row of the search: cfg with the row's layout (tp, cp,
 * pp, virtual stages, dp, and its uneven split's pp_layers, else none of
 * cfg's), micro-batch, micro-batches, checkpoint policy and sharding. */
ML_API ml_config ml_layout_config(const ml_config *cfg, const ml_layout_row *row);

/* The search over the layouts of req->gpus devices for cfg's model and
 * training settings (cfg->device must be present and have a peak for the
 * ranking by time; without one, rows are ranked by the fullest rank's
 * headroom). ML_OK with out->nrows 0 and a note when nothing fits; ML_USAGE
 * for a request that cannot be searched (no device, no global batch);
 * errors as ml_ledger_evaluate otherwise. */
ML_API ml_status ml_layout_search(const ml_model *m, const ml_config *cfg,
                                  const ml_layout_request *req, ml_layout_result *out,
                                  ml_error *err);

typedef struct ml_compare_row {
    ml_checkpoint checkpoint;
    char plan[256];
    uint64_t peak;
    uint64_t peak_total;
    uint64_t activations_saved;
    double flops_recompute;
    double flops_total;
    double recompute_pct;   /* flops_recompute / flops_total of `none`, in % */
    double step_time_s;     /* < 0 when unknown */
    bool has_device;
    bool fits;
    /* this row fits, and another fitting row recomputes less: the index of
     * the one that recomputes least (its freed memory is not needed, and
     * this row's extra step time buys nothing); -1 otherwise */
    int cheaper;
    int64_t headroom;       /* as ml_summary.headroom (the binding peak's); 0
                               without a device */
    ml_step_time time;      /* the per-op model's (source NONE: not timed) */
} ml_compare_row;

#define ML_COMPARE_ROWS 7

/* none, full, every-2, every-4, sqrt, selective and (with a device) optimal,
 * at cfg's micro-batch. Writes up to ML_COMPARE_ROWS rows and their count. */
ML_API ml_status ml_compare(const ml_model *m, const ml_config *cfg, ml_compare_row *rows,
                            size_t *nrows, ml_error *err);

/* The advice a plan gets when its recompute buys memory the run does not
 * need: a candidate policy (ml_checkpoint_candidates) that fits with less
 * recompute. cheaper_fits is false when the plan has no device, does not
 * fit, recomputes nothing, is `optimal`, or no cheaper policy fits. */
typedef struct ml_advice {
    bool cheaper_fits;
    ml_compare_row row; /* the fitting policy that recomputes least */
} ml_advice;

/* s is cfg's summary (ml_ledger_summary). Evaluates the candidates as
 * ml_compare does when s has recompute and fits; errors as ml_compare. */
ML_API ml_status ml_checkpoint_advice(const ml_model *m, const ml_config *cfg, const ml_summary *s,
                                      ml_advice *out, ml_error *err);

/* colocate: jobs sharing one device, each its own process with its own
 * runtime reserve (docs/colocate.md). */
typedef struct ml_colocate_result {
    uint64_t memory;        /* the device */
    uint64_t worst_total;   /* the jobs' peak totals summed: some phase lines the
                               peaks up when the jobs run unsynchronised */
    bool fits;              /* worst_total <= memory: at every phase */
    int64_t headroom;       /* memory - worst_total */
    bool timed;             /* every job has a step time and its events */
    bool aligned_known;     /* aligned_* computed (timed, and not too many
                               instants: ML_COLOCATE_MAX_INSTANTS) */
    uint64_t aligned_total; /* started together: the highest sum of the jobs'
                               steady curves (allocated + reserve + allowance) */
    double aligned_at_s;    /* when, seconds after the common start */
    double p_time_over;     /* two timed jobs at independent, uniform phases: the
                               share of time their sum is over memory; -1 when
                               not computed */
    /* the budget (docs/colocate.md, "The verdict"); appended, so the fields
     * above keep their offsets */
    uint64_t budget;        /* the line for peak_sum: the one given, else memory
                               less the jobs' runtime reserves */
    bool budget_given;      /* a budget was given (not the default) */
    uint64_t peak_sum;      /* the jobs' budget figures summed: each plan's
                               allocator peak, or its simulated reserved peak */
    size_t oom_job;         /* the first job (1-based) whose own plan runs out of
                               the device in the allocator simulation: its peak
                               total stops where it ran out, so the sums
                               understate it, and nothing fits (0: none) */
    int peaks_reserved;     /* each job's part of peak_sum is its plan's budget
                               figure: 0, every job's allocator peak; 1, every
                               job's simulated reserved peak; 2, some of each */
} ml_colocate_result;

/* One job of a colocation: a training job's ledger (its steady curve), or
 * an inference job, flat at its peak (docs/colocate.md, "Inference jobs").
 * Exactly one of the two is set. */
typedef struct ml_colocate_job {
    const ml_ledger *ledger;
    const ml_inference *inference;
} ml_colocate_job;

#define ML_COLOCATE_MAX_INSTANTS 20000000u

/* jobs: ledgers evaluated with keep_events (their steady iteration's curve
 * and step time); ML_USAGE for fewer than two, ML_OVERFLOW, ML_NOMEM. */
ML_API ml_status ml_colocate(const ml_ledger *const *jobs, size_t n, uint64_t memory,
                             ml_colocate_result *out, ml_error *err);
/* The same over training and inference jobs, with a budget for the jobs'
 * allocator peaks summed (0: the default, memory less the jobs' runtime
 * reserves): fits when peak_sum <= budget and worst_total <= memory;
 * headroom = min(budget - peak_sum, memory - worst_total), as plan's
 * (docs/ledger.md, "The verdict"). ML_USAGE for fewer than two jobs or a
 * job with neither or both set, ML_RANGE for a budget above memory,
 * ML_OVERFLOW, ML_NOMEM. The default budget is 0 when the reserves reach
 * past the device (then the device total does not fit either). */
ML_API ml_status ml_colocate_jobs(const ml_colocate_job *jobs, size_t n, uint64_t memory,
                                  uint64_t budget, ml_colocate_result *out, ml_error *err);
/* A job's level at t_s seconds into its periodic steady iteration: the
 * allocator's bytes after the last event at or before it, plus the runtime
 * reserve and fragmentation allowance; the reserve alone without events or
 * a step time. */
ML_API uint64_t ml_colocate_level(const ml_ledger *l, double t_s);
/* The same for either kind of job: an inference job's is its device total
 * at every t_s. */
ML_API uint64_t ml_colocate_job_level(const ml_colocate_job *j, double t_s);

/* triage: what the peak of a configuration that ran out of memory is made
 * of, and every remedy that applies, each re-planned with the ledger and
 * ranked (docs/cli.md, "triage"). */

/* The phase the run failed in (torch.cuda.OutOfMemoryError's traceback):
 * remedies that act on it rank first among those that fit. */
typedef enum ml_triage_phase {
    ML_TRIAGE_ANY,       /* not given: rank by slowdown alone */
    ML_TRIAGE_FORWARD,   /* activations: micro-batch, checkpointing, attention, logits */
    ML_TRIAGE_BACKWARD,  /* gradients and states: precision, optimizer, ZeRO, offload */
    ML_TRIAGE_OPTIMIZER, /* the step: states, master weights, ZeRO, offload */
    ML_TRIAGE_EVAL,      /* the evaluation pass: its batch */
    ML_TRIAGE_PHASE_COUNT
} ml_triage_phase;

/* "any", "forward", "backward", "optimizer", "eval". */
ML_API const char *ml_triage_phase_name(ml_triage_phase p);
/* Reverse lookup; false when the name is unknown. */
ML_API bool ml_triage_phase_parse(const char *s, ml_triage_phase *out);

typedef enum ml_remedy_kind {
    /* in this order, least intrusive first, they break ties in the ranking */
    ML_REMEDY_LOGITS_RELEASED, /* the loop drops the model output after the loss */
    ML_REMEDY_ZERO_GRAD_NONE,  /* zero_grad(set_to_none=True) where it was zero */
    ML_REMEDY_EVAL_BATCH,      /* half the evaluation batch, when the eval pass binds */
    ML_REMEDY_EXPANDABLE,      /* expandable_segments:True, when fragmentation counts */
    ML_REMEDY_ATTENTION_SDPA,  /* transformers whose attention is eager */
    ML_REMEDY_MICRO_BATCH,     /* a smaller micro-batch, more accumulation: same effective batch */
    ML_REMEDY_CKPT_FULL,
    ML_REMEDY_CKPT_EVERY_2,
    ML_REMEDY_CKPT_EVERY_4,
    ML_REMEDY_CKPT_SQRT,
    ML_REMEDY_CKPT_SELECTIVE,  /* models with attention */
    ML_REMEDY_CKPT_OPTIMAL,    /* with a device */
    ML_REMEDY_ZERO_1,          /* data_parallel > 1, above the current stage */
    ML_REMEDY_ZERO_2,
    ML_REMEDY_ZERO_3,
    ML_REMEDY_AMP_BF16,        /* from fp32 */
    ML_REMEDY_BF16_MASTER,     /* from fp32 */
    ML_REMEDY_ADAM_8BIT,       /* from adam/adamw */
    ML_REMEDY_ADAFACTOR,       /* from adam/adamw */
    ML_REMEDY_OFFLOAD_OPTIMIZER,
    ML_REMEDY_OFFLOAD_PARAMS,  /* with zero 3 */
    ML_REMEDY_TOKEN_BUDGET,    /* lengths, padded, a device: the largest budget that fits */
    ML_REMEDY_LENGTH_BUCKETS,  /* lengths, padded: --batching bucketed */
    ML_REMEDY_LOGITS_FUSED,    /* decoders: Liger's fused linear cross-entropy */
    ML_REMEDY_COUNT
} ml_remedy_kind;

/* "micro-batch", "checkpoint-full", ..., "expandable-segments". */
ML_API const char *ml_remedy_name(ml_remedy_kind k);

/* At most one remedy of each kind; room for kinds appended later. */
#define ML_TRIAGE_MAX_REMEDIES 32

typedef struct ml_triage_request {
    ml_triage_phase oom_phase; /* default ML_TRIAGE_ANY */
    uint64_t allocated;        /* observed max_memory_allocated() of the failing run, bytes;
                                  0 = not given */
    uint64_t reserved;         /* observed max_memory_reserved(), bytes; 0 = not given */
    double host_bandwidth;     /* bytes/s between host and device, to price offload's
                                  transfers; default 25e9 (PCIe 4.0 x16 as achieved) */
    const ml_lengths *lengths; /* a length distribution (borrowed); NULL: the config's one
                                  batch shape. With one, the triaged peak is its worst
                                  batch (docs/lengths.md, "Triage") */
    ml_lengths_request batching; /* how batches are drawn from lengths; default
                                    ml_lengths_request_defaults() */
} ml_triage_request;

ML_API ml_triage_request ml_triage_request_defaults(void);

typedef struct ml_remedy {
    ml_remedy_kind kind;
    char flags[160];         /* the command-line flags that apply it ("--micro-batch 4
                                --grad-accum 8"; attention-sdpa: "--attention sdpa") */
    ml_config config;        /* the variant as planned (for attention-sdpa the model's
                                attention changes too) */
    uint64_t peak;           /* its binding allocator peak (steady, first or eval) */
    uint64_t peak_total;     /* + fragmentation and runtime reserve */
    bool has_device;
    bool fits;               /* false without a device */
    bool in_focus;           /* acts on req->oom_phase */
    double flops_total;      /* per iteration; < 0 not derived (token-budget,
                                length-buckets: the batch size varies) */
    double flops_ratio;      /* flops_total over the configuration's; < 0 not derived */
    double step_time_s;      /* < 0 when unknown; offload adds its host transfers */
    double slowdown;         /* step time ratio when known, else flops_ratio; < 0 not
                                derived (ranks after the known ones) */
    uint64_t host_bytes;     /* offloaded to host memory, per device */
    double host_transfer;    /* bytes over the host link per iteration, per device */
    double comm_bytes;       /* bytes each device sends per iteration */
    char changes[640];       /* what it changes in training, one paragraph */
    ml_lengths_request batching; /* with lengths: the batching it plans (token-budget's
                                    max_tokens, length-buckets' buckets) */
} ml_remedy;

typedef struct ml_triage_observed {
    bool has_allocated, has_reserved;
    uint64_t allocated, reserved;     /* as given */
    uint64_t planned_allocated;       /* the binding allocator peak */
    uint64_t planned_reserved;        /* the simulated reserved peak (device.allocator), else
                                         planned_allocated + the fragmentation allowance */
    bool reserved_simulated;
    int64_t allocated_error;          /* planned - observed: > 0 the plan over-states */
    int64_t reserved_error;
    double fragmentation;             /* reserved / allocated - 1, with both given */
    bool fragmented;                  /* fragmentation above 20 %: expandable segments */
} ml_triage_observed;

typedef struct ml_triage_result {
    ml_summary current;               /* the configuration as given */
    uint64_t peak;                    /* its binding allocator peak */
    double host_transfer;             /* its offload's bytes over the host link per
                                         iteration (0 without offload) */
    double step_time_s;               /* current.step_time_s plus that transfer; < 0 unknown */
    ml_triage_phase focus;            /* req->oom_phase */
    bool has_observed;
    ml_triage_observed observed;
    size_t count;                     /* remedies that apply, ranked */
    ml_remedy remedies[ML_TRIAGE_MAX_REMEDIES];
    bool has_lengths;                 /* req->lengths given: current is the worst batch
                                         (lengths.max's micro-batch and seq_len) */
    ml_lengths_result lengths;        /* the configuration's batches (ml_lengths_plan) */
} ml_triage_result;

/* Plans cfg, then every remedy that applies to it (each re-planned with
 * ml_ledger_evaluate; one that does not lower the peak total is not listed,
 * except expandable segments when fragmentation is observed), ranked: those
 * that fit first, by least slowdown (those in the focus phase first); then
 * those that do not, by lowest peak total. *out is written only on success
 * (it is large: about 70 KiB). With req->lengths, cfg's batches are planned
 * first (ml_lengths_plan with req->batching) and the configuration triaged is
 * cfg at the worst batch's micro-batch and seq_len; the token-budget and
 * length-buckets remedies join (docs/lengths.md, "Triage"). Returns ML_OK,
 * or the status of evaluating cfg (ML_RANGE, ML_OVERFLOW, ML_NOMEM; with
 * lengths also ml_lengths_plan's: ML_USAGE for a model without a sequence,
 * ML_RANGE); ML_NOMEM from a remedy's evaluation. */
ML_API ml_status ml_triage(const ml_model *m, const ml_config *cfg, const ml_triage_request *req,
                           ml_triage_result *out, ml_error *err);

#ifdef __cplusplus
}
#endif
#endif
