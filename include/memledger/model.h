/* memledger — models and training/device configuration.
 *
 * A model file (YAML) describes a network (decoder, encoder or sequential
 * layer list) plus the training and device settings it is planned for. The
 * network is immutable once loaded; the settings are a plain value struct
 * (ml_config) that callers copy and change freely, e.g. to sweep micro-batch
 * sizes, and pass to ml_ledger_evaluate(). */
#ifndef MEMLEDGER_MODEL_H
#define MEMLEDGER_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ml_precision {
    ML_PREC_FP32,        /* everything fp32 */
    ML_PREC_AMP_BF16,    /* torch.autocast(bfloat16): fp32 params/grads/states */
    ML_PREC_AMP_FP16,    /* torch.autocast(float16) + GradScaler */
    ML_PREC_BF16_MASTER, /* bf16 params+grads, fp32 master weights and states */
    ML_PREC_FP16_MASTER, /* fp16 params+grads, fp32 master weights and states */
    ML_PREC_BF16,        /* everything bf16, states included */
    ML_PREC_COUNT
} ml_precision;

typedef enum ml_optimizer {
    ML_OPT_SGD,
    ML_OPT_SGD_MOMENTUM,
    ML_OPT_ADAM,
    ML_OPT_ADAMW,
    ML_OPT_ADAFACTOR,
    ML_OPT_ADAM_8BIT,
    ML_OPT_LION,
    ML_OPT_COUNT
} ml_optimizer;

typedef enum ml_optimizer_impl {
    ML_IMPL_FOR_LOOP,
    ML_IMPL_FOREACH,
    ML_IMPL_FUSED,
    ML_IMPL_COUNT
} ml_optimizer_impl;

typedef enum ml_checkpoint_kind {
    ML_CKPT_NONE,      /* keep every saved tensor */
    ML_CKPT_FULL,      /* every block is its own checkpoint segment */
    ML_CKPT_EVERY,     /* segments of `every` consecutive blocks */
    ML_CKPT_SQRT,      /* segments of ceil(sqrt(n)) blocks (Chen et al. 2016) */
    ML_CKPT_SELECTIVE, /* recompute the attention core only (Korthikanti 2022) */
    ML_CKPT_LIST,      /* the listed blocks, each its own segment */
    ML_CKPT_OPTIMAL,   /* least recompute whose peak fits the budget (docs/optimal.md) */
    ML_CKPT_SEGMENTS,  /* the listed segments of consecutive blocks, each recomputed
                          as one: "[0-3] [8]", what an optimal plan prints */
    ML_CKPT_COUNT
} ml_checkpoint_kind;

#define ML_CKPT_LIST_MAX 256u

typedef struct ml_checkpoint {
    ml_checkpoint_kind kind;
    uint32_t every;                     /* ML_CKPT_EVERY: blocks per segment */
    uint32_t count;                     /* ML_CKPT_LIST: entries in blocks[];
                                           ML_CKPT_SEGMENTS: segments */
    uint32_t blocks[ML_CKPT_LIST_MAX];  /* ML_CKPT_LIST: block indices;
                                           ML_CKPT_SEGMENTS: first and last block
                                           of each (pairs, ascending, at most
                                           ML_CKPT_LIST_MAX / 2 segments) */
} ml_checkpoint;

typedef enum ml_offload {
    ML_OFFLOAD_NONE,
    ML_OFFLOAD_OPTIMIZER, /* optimizer states, master weights and the step on the host */
    ML_OFFLOAD_PARAMS,    /* also the parameters (needs zero: 3) */
    ML_OFFLOAD_COUNT
} ml_offload;

/* What the training loop does with the model output (the logits) once the
 * loss is computed (docs/ledger.md, "the loop's references"). */
typedef enum ml_logits {
    ML_LOGITS_KEPT,     /* held until the iteration ends (a plain loop, nanoGPT) */
    ML_LOGITS_RELEASED, /* dropped once the loss is computed (HF Trainer, Lightning,
                           torchtitan) */
    ML_LOGITS_FUSED,    /* a chunked linear-cross-entropy that computes the head's
                           gradients in forward (Liger Kernel): never whole */
    ML_LOGITS_THROUGH_BACKWARD, /* held through the backward, dropped before the
                           step (a loop that `del out` after backward(), or
                           whose forward and backward run in one function) */
    ML_LOGITS_COUNT
} ml_logits;

/* A multimodal model's vision tower in training (docs/cli.md, "The model
 * file"): trained and checkpointed as training.checkpoint says (same: what
 * Hugging Face's gradient_checkpointing_enable does), trained with no layer
 * or every layer checkpointed whatever the decoder's policy (none, full), or
 * frozen (requires_grad_(False): no graph, gradient or optimizer state). */
typedef enum ml_vision_tower {
    ML_VT_SAME,
    ML_VT_NONE,
    ML_VT_FULL,
    ML_VT_FROZEN,
    ML_VT_COUNT
} ml_vision_tower;

/* Megatron-LM's sequence parallelism beside tensor parallelism
 * (docs/parallel.md): on by default when parallel.tp > 1, as Megatron-core
 * and torchtitan have it. */
typedef enum ml_seq_parallel {
    ML_SP_AUTO, /* on when tensor_parallel > 1 */
    ML_SP_ON,
    ML_SP_OFF,
    ML_SP_COUNT
} ml_seq_parallel;

/* The order a pipeline's stages run their micro-batches (docs/parallel.md):
 * one forward then one backward after a warmup (Megatron-LM's 1F1B, the
 * default), every forward then every backward (GPipe), or 1F1B over
 * virtual stages (parallel.vpp model chunks per stage: Megatron's
 * interleaved schedule). */
typedef enum ml_pp_schedule {
    ML_PP_1F1B,
    ML_PP_GPIPE,
    ML_PP_INTERLEAVED,
    ML_PP_COUNT
} ml_pp_schedule;

#define ML_PP_MAX_STAGES 256

/* The training engine whose layers and gradients the plan models
 * (docs/parallel.md, "Megatron-core's layer"): eager PyTorch (Hugging
 * Face's and nanoGPT's modules, the default), or Megatron-LM's GPT layer
 * (its fused masked softmax keeps no mask) with its fp32 main-gradient
 * buffer, resident all iteration. */
typedef enum ml_engine {
    ML_ENGINE_EAGER,
    ML_ENGINE_MEGATRON,
    ML_ENGINE_COUNT
} ml_engine;

/* What optimizer.zero_grad() does between iterations. */
typedef enum ml_zero_grad {
    ML_ZERO_GRAD_SET_TO_NONE, /* frees every .grad (PyTorch 2.x's default) */
    ML_ZERO_GRAD_ZERO,        /* fills them with zeros: they stay allocated */
    ML_ZERO_GRAD_COUNT
} ml_zero_grad;

typedef struct ml_training {
    uint64_t micro_batch;   /* samples per forward/backward */
    uint64_t seq_len;       /* tokens per sample (transformers) */
    uint64_t grad_accum;    /* micro-batches per optimizer step */
    ml_precision precision;
    ml_optimizer optimizer;
    ml_optimizer_impl optimizer_impl;
    ml_checkpoint checkpoint;
    /* data parallelism and sharding (docs/sharding.md); all byte figures are
     * per device */
    uint64_t data_parallel;        /* devices holding a replica or a shard */
    unsigned zero;                 /* 0: none; 1: optimizer states; 2: + grads;
                                      3: + params (FSDP full shard) */
    ml_offload offload;
    uint64_t reduce_bucket;        /* elements; DeepSpeed reduce_bucket_size 5e8 */
    uint64_t allgather_bucket;     /* elements; DeepSpeed allgather_bucket_size 5e8 */
    ml_logits logits;              /* the loop's reference to the model output */
    /* the evaluation pass (model.eval(), no_grad); 0: none planned */
    uint64_t eval_batch;           /* samples per evaluation forward */
    uint64_t eval_seq_len;         /* tokens per evaluation sample; 0: seq_len */
    ml_zero_grad zero_grad;        /* set_to_none (default) or zero */
    uint64_t logits_chunk;         /* logits: fused, tokens per chunk; 0: Liger's rule
                                      (docs/ledger.md, "The loop's references") */
    double expert_imbalance;       /* a mixture of experts' busiest expert: its tokens over
                                      an even share, >= 1 (default 1: a balanced router);
                                      sizes its transients (docs/inventory.md) */
    uint64_t target_len;           /* an encoder-decoder's decoder tokens per sample (T5's
                                      labels); 0: seq_len */
    ml_vision_tower vision_tower;  /* a multimodal model's tower: same (default), none,
                                      full or frozen */
    /* model parallelism (docs/parallel.md; YAML parallel:): every figure is
     * one rank's */
    uint64_t tensor_parallel;      /* parallel.tp: ranks splitting each layer (Megatron's
                                      column- and row-parallel linears); 0 or 1: none */
    ml_seq_parallel sequence_parallel; /* parallel.sp */
    uint64_t pipeline_parallel;    /* parallel.pp: stages (1 to ML_PP_MAX_STAGES); 0 or 1:
                                      none. The micro-batches of a step are grad_accum */
    uint64_t virtual_stages;       /* parallel.vpp: model chunks per stage (interleaved);
                                      0 or 1: one */
    ml_pp_schedule pp_schedule;    /* parallel.pp_schedule (interleaved with vpp > 1) */
    uint32_t npp_layers;           /* parallel.pp_layers: layers of each stage, in order;
                                      0: an even split */
    uint32_t pp_layers[ML_PP_MAX_STAGES];
    ml_engine engine;              /* training.engine: eager (default) or megatron */
    bool dist_optimizer;           /* parallel.dist_optimizer: Megatron's distributed
                                      optimizer (engine megatron): fp32 master weights and
                                      optimizer states sharded over the data-parallel ranks
                                      as its padded buffers lay them out */
    uint64_t dp_shard;             /* parallel.dp_shard: the data-parallel ranks a ZeRO or
                                      distributed-optimizer shard spans (HSDP's shard
                                      group, Megatron's distributed-optimizer instance);
                                      0: all of data_parallel. The others are replicas */
    bool overlap_grad_reduce;      /* parallel.overlap_grad_reduce: the data-parallel
                                      gradient collectives run beside the step's last
                                      backward (Megatron's --overlap-grad-reduce, DDP's
                                      buckets): only what outlasts it is in the step */
    uint64_t context_parallel;     /* parallel.cp: ranks splitting each sequence (ring
                                      attention, docs/parallel.md "Context
                                      parallelism"); 0 or 1: none. The gradients'
                                      reduction and a ZeRO shard span dp x cp ranks */
    uint64_t expert_parallel;      /* parallel.ep: ranks splitting a mixture of experts'
                                      routed experts (each holds experts / ep of them and
                                      runs the tokens an all-to-all brings it,
                                      docs/parallel.md "Expert parallelism"), taken from
                                      the dp x cp ranks; 0 or 1: none */
    uint64_t expert_tensor_parallel; /* parallel.etp: ranks splitting each routed expert's
                                        width (Megatron's expert tensor parallelism: an
                                        all-gather of the dispatched rows, a
                                        reduce-scatter of the outputs); 0: tp, Megatron's
                                        default. With tp x cp x dp = etp x ep x the
                                        experts' data-parallel ranks */
    double expert_capacity;        /* training.expert_capacity: Megatron's expert capacity
                                      factor under its dispatch (a rank sends each expert
                                      at most ceil(k tokens / E x it) of its pairs, the
                                      others dropped); 0: none */
    bool expert_pad;               /* training.expert_pad: each expert's share padded to
                                      the capacity (Megatron's
                                      --moe-pad-expert-input-to-capacity) */
} ml_training;

/* PyTorch's CUDA caching allocator as the planner simulates it
 * (docs/allocator.md): not at all (the allocated bytes and the
 * fragmentation allowance), its default configuration, or
 * expandable_segments:True. */
typedef enum ml_allocator {
    ML_ALLOCATOR_NONE,
    ML_ALLOCATOR_CACHING,
    ML_ALLOCATOR_EXPANDABLE,
    ML_ALLOCATOR_COUNT
} ml_allocator;

/* The dtype a plan's matrix products run in, which picks the device's peak
 * (docs/devices.md): fp32 plans multiply in fp32 (PyTorch's default since
 * 1.12: torch.backends.cuda.matmul.allow_tf32 = False), amp-bf16, bf16 and
 * bf16-master in bf16, amp-fp16 and fp16-master in fp16. tf32 and fp8 are
 * listed for the presets' tables; no precision policy selects them. */
typedef enum ml_compute_dtype {
    ML_COMPUTE_FP32,
    ML_COMPUTE_TF32,
    ML_COMPUTE_BF16,
    ML_COMPUTE_FP16,
    ML_COMPUTE_FP8,
    ML_COMPUTE_COUNT
} ml_compute_dtype;

/* A named accelerator (docs/devices.md, one source per row): its capacity
 * and its dense (not 2:4 sparse) peak per compute dtype. Rows are static
 * and constant. */
typedef struct ml_device_preset {
    const char *name;      /* "h100-sxm": what --device and device.name take */
    const char *aliases;   /* other spellings, space-separated ("h100 h100-80gb") */
    const char *product;   /* the name the driver reports
                              (torch.cuda.get_device_name), e.g. "NVIDIA H200";
                              a calibration profile's `device` is matched to it */
    uint64_t memory;       /* bytes: the total the driver reports (nvidia-smi's
                              MiB) where a reading is published, else the
                              nominal capacity in GiB (docs/devices.md) */
    double peak_tflops[ML_COMPUTE_COUNT]; /* dense TFLOP/s; 0 = unsupported or
                                             not published */
    /* for the step-time model (docs/time.md); 0 = not published */
    double memory_gbps;    /* DRAM (HBM, GDDR) bandwidth, GB/s = 1e9 bytes/s */
    unsigned sms;          /* streaming multiprocessors (compute units) */
    /* for the transfers (docs/devices.md, "Links"), GB/s each way; 0 = not
     * published */
    double interconnect_gbps; /* between the devices of a node: NVLink (the
                                 fabric every device of an 8-device board
                                 reaches) or else PCIe */
    double network_gbps;      /* between nodes, per device: the reference
                                 server's network adapters (DGX) */
    /* the cuBLAS workspace PyTorch allocates per handle and stream on this
     * device by default (ml_device.blas_workspace) */
    uint64_t blas_workspace;
} ml_device_preset;

typedef struct ml_device {
    bool present;              /* a device was given: verdict is computed */
    uint64_t memory;           /* capacity, bytes */
    uint64_t budget;           /* line for the reserved peak (the allocator-view
                                  peak with allocator NONE), bytes;
                                  0 = memory - runtime_reserve */
    uint64_t runtime_reserve;  /* what PyTorch's allocator never sees: the CUDA
                                  context, the libraries' own memory; bytes
                                  (cuBLAS's workspaces go through the
                                  allocator: blas_workspace) */
    double peak_tflops;        /* dense peak at the compute dtype; 0 = unknown */
    double efficiency;         /* achieved fraction of peak_tflops, (0, 1]; a
                                  model file or flag: 1e-6 to 1 */
    double fragmentation;      /* allowance for the caching allocator's reserved bytes
                                  over its allocated peak, a fraction in [0, 1];
                                  0 = none (docs/ledger.md) */
    ml_allocator allocator;    /* simulate the caching allocator: reserved bytes
                                  (ml_config_defaults: CACHING; a zeroed
                                  struct: NONE) */
    uint64_t max_split_size;   /* max_split_size_mb in bytes; 0 = unlimited */
    /* bandwidths that time communication and host transfers (docs/sharding.md,
     * "Time"), GB/s = 1e9 bytes/s; 0 = not given: that part is not timed and
     * the step time leaves it out */
    double interconnect_gbps;  /* per device, collective bus bandwidth (NCCL's busbw) */
    double pcie_gbps;          /* host <-> device, each way */
    /* the named device this one started from (ml_device_preset_apply), or
     * NULL; with no peak_tflops of its own the step time takes the preset's
     * peak at the plan's compute dtype (ml_device_peak) */
    const ml_device_preset *preset;
    /* the simulated allocator's state when the job starts: what this trace
     * (ml_alloc_trace_load_file) leaves allocated stays allocated and what it
     * leaves reserved stays reserved, as in a process that ran something
     * before; the peaks start from there (reset_peak_memory_stats). Borrowed:
     * the caller keeps it alive while the config is used. NULL: an empty
     * cache. Only with a simulated allocator (docs/allocator.md, "A process
     * that ran something before"). */
    const struct ml_alloc_trace *start;
    /* bytes of the workspace PyTorch gives each cuBLAS handle and stream
     * through the caching allocator (CublasHandlePool.cpp): made at a
     * thread's first matrix product and kept for the process's life. The
     * simulation makes one at the forward's first product and one at the
     * backward's (the autograd engine's thread has a handle of its own), in
     * the first iteration; none with a start state (a process that ran
     * before has made them). ml_config_defaults: ML_BLAS_WORKSPACE_CUDA;
     * a preset: its device's; 0 = none (docs/allocator.md). */
    uint64_t blas_workspace;
} ml_device;

/* PyTorch's default cuBLAS workspace on CUDA devices other than Hopper
 * (CUBLAS_WORKSPACE_CONFIG=:4096:2:16:8: 2 x 4 MiB + 8 x 16 KiB); Hopper's
 * (sm90) is 4,096 KiB x 8 = 32 MiB. */
#define ML_BLAS_WORKSPACE_CUDA 8519680u

struct ml_profile;

/* An allocation trace: the CSV `action,id,bytes` that `memledger allocator`
 * replays (docs/allocator.md), for ml_device.start. */
typedef struct ml_alloc_trace ml_alloc_trace;
/* Reads and checks a trace file. On success *out owns it (free with
 * ml_alloc_trace_destroy); on failure err names the file, line and column.
 * Returns ML_OK, ML_IO, ML_SCHEMA, ML_RANGE or ML_NOMEM. */
ML_API ml_status ml_alloc_trace_load_file(const char *path, ml_alloc_trace **out,
                                          ml_error *err);
/* NULL is accepted. */
ML_API void ml_alloc_trace_destroy(ml_alloc_trace *t);

typedef struct ml_config {
    ml_training training;
    ml_device device;
    /* A measured calibration profile (calib.h), borrowed: the caller keeps it
     * alive while the config is used. NULL: analytic values only. */
    const struct ml_profile *calib;
} ml_config;

/* Defaults: micro_batch 1, seq_len 1 (overridden by the model), grad_accum 1,
 * fp32, adamw, foreach, no checkpointing, data_parallel 1, zero 0, no
 * offload, buckets of 5e8 elements, logits kept, no evaluation pass; no device, runtime_reserve 512 MiB,
 * efficiency 1.0, the caching allocator simulated (ML_ALLOCATOR_CACHING). */
ML_API ml_config ml_config_defaults(void);

typedef struct ml_model ml_model;

/* Loads and validates a model file. On success *out owns a new model (free
 * with ml_model_destroy) and err is untouched; on failure *out is unchanged
 * and err says where and why. Returns ML_OK, ML_IO, ML_SYNTAX, ML_SCHEMA,
 * ML_RANGE or ML_NOMEM. */
ML_API ml_status ml_model_load_file(const char *path, ml_model **out, ml_error *err);

/* Same, from a buffer; `name` is used as the path in messages. */
ML_API ml_status ml_model_load_string(const char *text, size_t len, const char *name,
                                      ml_model **out, ml_error *err);

/* Loads a Hugging Face config.json (model_type llama, mistral, qwen2, gpt2,
 * gpt_neox, bert or vit; docs/hf.md), or the config.json in config_path
 * when it names a folder (a model's, as from_pretrained takes it), and,
 * when training_path is not NULL, a YAML file with training: and device:
 * sections. Ownership and statuses as ml_model_load_file. */
ML_API ml_status ml_model_load_hf(const char *config_path, const char *training_path,
                                  ml_model **out, ml_error *err);

/* Same, from a buffer holding the config.json; `name` is used as the path in
 * messages and for the model's name. */
ML_API ml_status ml_model_load_hf_string(const char *text, size_t len, const char *name,
                                         ml_model **out, ml_error *err);

/* Accepts NULL. */
ML_API void ml_model_destroy(ml_model *m);

/* Where the model's file (or the --training file of a Hugging Face config)
 * set a configuration key: "training.micro_batch", "parallel.tp",
 * "device.memory" (a compact `parallel: tp2.dp4` answers for every
 * parallel.* key). True with *line and *col (1-based) set; false when the
 * file did not set it. For messages about a setting that come after the
 * model loaded (a plan's refusal). */
ML_API bool ml_model_key_position(const ml_model *m, const char *key, unsigned *line,
                                  unsigned *col);
/* The same for a message about a setting ("parallel.tp: ..."): when the
 * key its message begins with is one the file set, its line and column
 * into e (true); else e->line and e->col 0 (false). */
ML_API bool ml_model_locate_error(const ml_model *m, ml_error *e);

/* The model's `name:`; never NULL. Owned by the model. */
ML_API const char *ml_model_name(const ml_model *m);

/* Plans the model with another attention implementation: "eager", "sdpa" or
 * "flash" (the model file's model.attention), or Hugging Face's names
 * flash_attention_2 and flash_attention_3 for flash (docs/inventory.md).
 * ML_SCHEMA, the model unchanged, for another name or a sequential model
 * (its attention layers are planned eager). */
ML_API ml_status ml_model_set_attention(ml_model *m, const char *name, ml_error *err);
/* The attention implementation planned: "eager", "sdpa" or "flash"; NULL
 * for a sequential model. */
ML_API const char *ml_model_attention(const ml_model *m);
/* Why the attention planned was assumed, when the input named none (a
 * Hugging Face config.json without attn_implementation: transformers'
 * default, docs/hf.md); NULL when the model file, the config.json or
 * ml_model_set_attention chose it. Owned by the library (static). */
ML_API const char *ml_model_attention_assumed(const ml_model *m);
/* An encoder-decoder's decoder tokens per sample under t (training.target_len,
 * or seq_len when 0); 0 for the other models, which have one sequence. */
ML_API uint64_t ml_model_target_len(const ml_model *m, const ml_training *t);
/* A mixture of experts' routed experts per layer (model.experts); 0 for a
 * dense model. */
ML_API uint64_t ml_model_experts(const ml_model *m);
/* A multimodal model's image tokens per sample (each sample one image; part
 * of training.seq_len); 0 for the other models. */
ML_API uint64_t ml_model_image_tokens(const ml_model *m);
/* The largest micro-batch the model's reference code accepts: 1 for a
 * decoder's sequence classifier without pad_token_id (transformers refuses
 * more); 0: no limit. */
ML_API uint64_t ml_model_max_micro_batch(const ml_model *m);
/* The sequence length the model fixes itself, which training.seq_len does
 * not change: 1 for a sequential model (its input shape is model.input),
 * a vision encoder's patches and class token; 0 where training.seq_len
 * sets it (the model file and the command line refuse another value). */
ML_API uint64_t ml_model_fixed_seq_len(const ml_model *m);
/* ML_RANGE, the message naming training.seq_len or training.eval_seq_len,
 * where the model fixes its sequence and t gives another length; ML_OK
 * otherwise. The model file, the command line, the jobs and the web page
 * refuse with it. */
ML_API ml_status ml_model_check_seq(const ml_model *m, const ml_training *t, ml_error *err);

/* The training and device settings written in the file (defaults filled in). */
ML_API ml_config ml_model_config(const ml_model *m);

/* The line the allocator peak is compared with: device.budget, or memory -
 * runtime_reserve when that is 0. */
ML_API uint64_t ml_device_budget(const ml_device *d);
/* The allocator peak the device itself admits: (memory - runtime_reserve) /
 * (1 + fragmentation), rounded down (docs/ledger.md). */
ML_API uint64_t ml_device_limit(const ml_device *d);

/* The device presets (docs/devices.md): the table and its length; static
 * and constant. */
ML_API const ml_device_preset *ml_device_presets(size_t *count);
/* The preset named `name` or one of its aliases, compared without case and
 * ignoring '-', '_', ' ' and '.' ("H100 SXM", "h100_sxm"); NULL when none. */
ML_API const ml_device_preset *ml_device_preset_find(const char *name);
/* Makes *d the named device: present, its memory, the preset, its cuBLAS
 * workspace, the budget back to its default (memory - runtime_reserve) and
 * no peak_tflops of its own; the other fields (runtime_reserve, efficiency,
 * allocator, ...) are kept. ML_OK, or ML_USAGE with a message listing the
 * known names (*d untouched). */
ML_API ml_status ml_device_preset_apply(const char *name, ml_device *d, ml_error *err);
/* Makes *d a device known by its size alone (--device SIZE): present, that
 * memory, and what a named device set back to the defaults: no preset, no
 * peak_tflops of its own, the budget memory - runtime_reserve, PyTorch's
 * default cuBLAS workspace (ML_BLAS_WORKSPACE_CUDA); the other fields are
 * kept, as ml_device_preset_apply keeps them. */
ML_API void ml_device_of_size(ml_device *d, uint64_t memory);
/* The compute dtype of a precision policy, and its name ("fp32", "tf32",
 * "bf16", "fp16", "fp8"). */
ML_API ml_compute_dtype ml_precision_compute_dtype(ml_precision p);
ML_API const char *ml_compute_dtype_name(ml_compute_dtype c);
/* The dense peak (TFLOP/s) a plan at precision p gets on d: d->peak_tflops
 * when set (the user's or the model file's figure), else the preset's peak
 * at p's compute dtype, else 0 (unknown: no step time). */
ML_API double ml_device_peak(const ml_device *d, ml_precision p);

/* The bandwidth between d and the other devices of its node (GB/s each
 * way; 0: unknown, transfers not timed): d->interconnect_gbps, else its
 * preset's; and between nodes, per device, its preset's (0: unknown). */
ML_API double ml_device_interconnect(const ml_device *d);
ML_API double ml_device_network(const ml_device *d);
/* ... and the link data parallelism's collectives get over `devices`
 * devices in all: d->interconnect_gbps when given (the whole group at it);
 * else the preset's link within a node while the devices fit one of 8,
 * its network beyond (0: unknown, not timed). */
ML_API double ml_device_dp_link(const ml_device *d, uint64_t devices);

/* Parses a size such as "8GiB", "6.5 GiB", "512MiB", "16GB" or "1024"
 * (bytes). Binary units B, KiB, MiB, GiB, TiB; decimal KB, MB, GB, TB.
 * Returns ML_OK, or ML_RANGE (negative, overflow) / ML_USAGE (syntax) with a
 * message in err (position fields left 0). */
ML_API ml_status ml_parse_size(const char *text, uint64_t *out, ml_error *err);

/* Parses a checkpoint policy: none | full | every-K | sqrt | selective |
 * "[0, 3, 6]". Returns ML_OK or ML_USAGE. */
ML_API ml_status ml_parse_checkpoint(const char *text, ml_checkpoint *out, ml_error *err);

/* The checkpoint policies the planner weighs on its own: fit's
 * --checkpoint auto, compare's rows (in this order), triage's remedies and
 * the optimal solver's fallback. `segments` marks the policies that cut the
 * chain into recomputed segments (not selective, not optimal);
 * `needs_device` the one that needs a budget. Returns the table and its
 * length; the table is static and constant. */
typedef struct ml_checkpoint_candidate {
    const char *name;  /* as ml_parse_checkpoint reads it */
    bool segments;
    bool needs_device;
} ml_checkpoint_candidate;

ML_API const ml_checkpoint_candidate *ml_checkpoint_candidates(size_t *count);

/* The accepted range of a whole-number setting, by its YAML key
 * ("training.micro_batch", "training.zero"): true and *lo, *hi set, or
 * false for a key with no such limit. The same numbers the loader and
 * ml_config_problem apply. */
ML_API bool ml_config_range(const char *key, uint64_t *lo, uint64_t *hi);

/* Sets one training or device setting of cfg from its text, by its YAML key
 * ("training.micro_batch", "device.memory"), the value read as the command
 * line reads the key's flag: a whole number within ml_config_range
 * ("training.zero" also takes "fsdp"), a size ("8GiB", "6.5 GiB", bytes;
 * device.max_split_size too, above 20MiB), a number (device.peak_tflops,
 * efficiency, fragmentation) or a name (precision, optimizer, optimizer_impl,
 * checkpoint as ml_parse_checkpoint, offload, logits, zero_grad, allocator).
 * Order matters as it does for the flags: device.memory marks the device
 * present and drops a budget set before it; device.budget needs the device
 * present; training.eval_seq_len needs training.eval_batch. On success cfg
 * is changed and err is cleared; on failure cfg is unchanged and err (no
 * position) names the key. Returns ML_OK, ML_RANGE (a number outside its
 * range, a bad size) or ML_USAGE (an unknown key or name, NULL argument, the
 * order above). */
ML_API ml_status ml_config_set(ml_config *cfg, const char *key, const char *value, ml_error *err);

/* Names as written in YAML and JSON ("amp-bf16", "adamw", "foreach"). */
ML_API const char *ml_precision_name(ml_precision p);
ML_API const char *ml_optimizer_name(ml_optimizer o);
ML_API const char *ml_optimizer_impl_name(ml_optimizer_impl i);
ML_API const char *ml_offload_name(ml_offload o);
ML_API const char *ml_logits_name(ml_logits l);
ML_API const char *ml_allocator_name(ml_allocator a);
ML_API const char *ml_zero_grad_name(ml_zero_grad z);
/* "same", "none", "full", "frozen". */
ML_API const char *ml_vision_tower_name(ml_vision_tower v);
ML_API bool ml_offload_parse(const char *s, ml_offload *out);
/* "eager", "megatron"; ml_engine_parse reads them. */
ML_API const char *ml_engine_name(ml_engine e);
ML_API bool ml_engine_parse(const char *s, ml_engine *out);
/* "1f1b", "gpipe", "interleaved"; ml_pp_schedule_parse reads them. */
ML_API const char *ml_pp_schedule_name(ml_pp_schedule s);
ML_API bool ml_pp_schedule_parse(const char *s, ml_pp_schedule *out);
/* Reads "7,8,8,9" (each stage's layers) into t's pp_layers: ML_OK, or
 * ML_USAGE with the reason (not whole numbers, more than ML_PP_MAX_STAGES,
 * a stage of 0). */
ML_API ml_status ml_pp_layers_parse(const char *text, ml_training *t, ml_error *err);
/* Whether sequence parallelism is on: tensor_parallel above 1 and sp not off. */
ML_API bool ml_training_sp(const ml_training *t);
/* The ranks the sharded states span: dp_shard, or data_parallel when 0 (at
 * least 1). */
ML_API uint64_t ml_training_shard(const ml_training *t);
/* The context-parallel ranks each sequence is split over (1 when none). */
ML_API uint64_t ml_training_cp(const ml_training *t);
/* The devices in all: tensor x context x pipeline x data parallelism. */
ML_API uint64_t ml_training_devices(const ml_training *t);
/* The expert-parallel ranks a mixture of experts' experts are split over
 * (1 when none). */
ML_API uint64_t ml_training_ep(const ml_training *t);
/* The expert-tensor-parallel ranks a routed expert's width is split over:
 * expert_tensor_parallel, or tensor_parallel when 0 (Megatron's default; 1
 * when neither). */
ML_API uint64_t ml_training_etp(const ml_training *t);
/* The compact layout "tp8.pp4.cp2.dp16" (the parts in any order, each at
 * most once; docs/parallel.md) into t: tp sets tensor_parallel, dp
 * data_parallel, pp pipeline_parallel, vpp virtual_stages (and the
 * interleaved schedule above 1), cp context_parallel, ep expert_parallel,
 * etp expert_tensor_parallel; a part given twice or an unknown one is
 * refused (ML_USAGE), a size out of range too (ML_RANGE). */
ML_API ml_status ml_parallel_parse(const char *text, ml_training *t, ml_error *err);
/* Writes the policy's YAML spelling ("every-2", "[0, 3]") into buf. */
ML_API void ml_checkpoint_format(const ml_checkpoint *c, char *buf, size_t size);
/* "1.50 GiB", "512.00 MiB", "12 B": binary units, two decimals (report.h's
 * users have them through model.h). */
ML_API void ml_format_bytes(uint64_t bytes, char *buf, size_t size);
/* "12.3 TFLOP", "4.56 GFLOP": decimal prefixes, as FLOPs always are. */
ML_API void ml_format_flops(double flops, char *buf, size_t size);

/* Reverse lookups; return false when the name is unknown. */
ML_API bool ml_precision_parse(const char *s, ml_precision *out);
ML_API bool ml_optimizer_parse(const char *s, ml_optimizer *out);
ML_API bool ml_optimizer_impl_parse(const char *s, ml_optimizer_impl *out);

#ifdef __cplusplus
}
#endif
#endif
