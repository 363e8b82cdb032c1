/* memledger — calibration: fitting measurements, and measured profiles.
 *
 * A profile (YAML, written by the calibration runner `memledger-calibrate`)
 * records what a real forward/backward pass kept and how fast the GEMMs ran;
 * ml_config.calib makes the planner use it. The same fitting turns a user's
 * own peak measurements into a fixed + per-sample model (docs/calibration.md). */
#ifndef MEMLEDGER_CALIB_H
#define MEMLEDGER_CALIB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "error.h"
#include "export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = fixed + slope * x by least squares. */
typedef struct ml_linfit {
    double fixed;
    double slope;
    double r2;               /* 1 for a perfect fit (also when y is constant) */
    double max_rel_residual; /* max |y - fit| / |y| */
    size_t n;
} ml_linfit;

/* Needs n >= 2 and two distinct x. Returns ML_OK or ML_RANGE. */
ML_API ml_status ml_linfit_points(const double *x, const double *y, size_t n, ml_linfit *out,
                                  ml_error *err);

/* A measured peak at a micro-batch (e.g. torch.cuda.max_memory_allocated). */
typedef struct ml_point {
    uint64_t micro_batch;
    uint64_t peak;   /* bytes */
    unsigned line;   /* CSV line, for messages */
} ml_point;

/* Reads a CSV with a header naming the columns micro_batch and peak (in any
 * order; other columns ignored); peaks are sizes ("5.4GiB") or bytes; fields
 * quoted as RFC 4180 quotes them (a comma or a line's end inside quotes, ""
 * for a quote) are read as their content. On
 * success *out (n entries) is the caller's to free(). Errors name the line
 * and column. Returns ML_OK, ML_IO, ML_SCHEMA, ML_RANGE or ML_NOMEM. */
ML_API ml_status ml_points_parse_csv(const char *text, size_t len, const char *name,
                                     ml_point **out, size_t *n, ml_error *err);
ML_API ml_status ml_points_load_csv(const char *path, ml_point **out, size_t *n, ml_error *err);

typedef struct ml_points_fit {
    ml_linfit fit;                     /* peak = fixed + per_sample * micro_batch */
    double fixed_bytes;
    double per_sample_bytes;
    uint64_t max_micro_batch;          /* largest under the budget by the fit (0: none) */
    uint64_t max_measured_micro_batch; /* largest measured point within the budget (0: none) */
    bool extrapolated;                 /* max_micro_batch lies past the measured points */
    double peak_at;                    /* predicted peak at `at` (when at > 0) */
} ml_points_fit;

/* Fits the points; budget 0 = no budget questions. */
ML_API ml_status ml_points_analyse(const ml_point *p, size_t n, uint64_t budget, uint64_t at,
                                   ml_points_fit *out, ml_error *err);

/* ---- profiles ---------------------------------------------------------- */

typedef struct ml_profile ml_profile;

/* One measured run of a layer kind at a shape. */
typedef struct ml_profile_point {
    uint64_t B, T, D;
    uint64_t saved_bytes;     /* tensors saved for backward at the end of forward */
    uint64_t peak_forward;    /* tracking allocator, bytes */
    uint64_t peak_backward;
    uint64_t peak_step;
    uint64_t device_peak;     /* the device's own view (CUDA), 0 when unknown */
    double time_s;            /* forward + backward + step */
    uint64_t H;               /* attention heads (blocks with attention); 0 = none/unknown */
    uint64_t cast_bytes;      /* autocast's bf16 weight copies kept for backward (amp
                                 runs); not in saved_bytes, not fitted: they scale with
                                 the weights, and the planner counts them itself */
    uint64_t F;               /* MLP width (mlp and the blocks); 0 = not recorded */
} ml_profile_point;

typedef struct ml_profile_gemm {
    uint64_t m, n, k;
    double tflops;
} ml_profile_gemm;

/* Layer kinds a profile may hold: the one list, which the calibration
 * runner's layers are indexed by too. */
typedef enum ml_profile_kind_id {
    ML_PK_LINEAR,
    ML_PK_MLP,
    ML_PK_TRANSFORMER_BLOCK, /* GPT-2 style */
    ML_PK_LM_HEAD,           /* embedding + LM head + cross-entropy */
    ML_PK_LLAMA_BLOCK,       /* Llama style */
    ML_PK_COUNT
} ml_profile_kind_id;
#define ML_PROFILE_KINDS "linear, mlp, transformer_block, lm_head, llama_block"

/* "linear", "mlp", "transformer_block", "lm_head", "llama_block"; NULL out
 * of range. */
ML_API const char *ml_profile_kind_name(ml_profile_kind_id k);
/* The id of a kind's name; false when it is none. */
ML_API bool ml_profile_kind_parse(const char *name, ml_profile_kind_id *out);

ML_API ml_profile *ml_profile_new(void);
/* Accepts NULL. */
ML_API void ml_profile_destroy(ml_profile *p);
/* Descriptive fields: "name", "backend", "device", "dtype", "driver",
 * "library", "created", "notes", "precision" (the policy the layers ran
 * under: "fp32" or "amp-bf16"; empty in profiles that predate it). Returns
 * ML_OK, ML_USAGE or ML_NOMEM. */
ML_API ml_status ml_profile_set(ml_profile *p, const char *key, const char *value);
ML_API const char *ml_profile_get(const ml_profile *p, const char *key);
ML_API ml_status ml_profile_add_point(ml_profile *p, const char *kind, const ml_profile_point *pt);
ML_API ml_status ml_profile_add_gemm(ml_profile *p, const ml_profile_gemm *g);
/* Device dense peak (TFLOP/s) the efficiency refers to; 0 = unknown. */
ML_API void ml_profile_set_peak(ml_profile *p, double peak_tflops);
/* The host's dispatch cost (the profile's `host:` section, docs/time.md):
 * seconds per kernel launched in forward and by a backward node, per
 * block's forward and backward besides its kernels (its modules, its
 * hooks), per block recomputed under checkpointing, per optimizer
 * foreach call and per tensor in it. */
typedef struct ml_profile_host {
    double forward_op_s, backward_op_s, forward_block_s, backward_block_s, recompute_block_s,
        step_call_s, step_tensor_s;
} ml_profile_host;
ML_API void ml_profile_set_host(ml_profile *p, const ml_profile_host *h);
/* NULL when the profile has no host section. */
ML_API const ml_profile_host *ml_profile_host_costs(const ml_profile *p);
/* The memory bandwidth measured on the profile's device (`memory_gbps`,
 * GB/s = 1e9 bytes/s; docs/time.md); 0: not measured. */
ML_API void ml_profile_set_memory_gbps(ml_profile *p, double gbps);
ML_API double ml_profile_memory_gbps(const ml_profile *p);
/* Fits c and the fixed term per kind (saved = c * B*T*D*b + fixed); for the
 * blocks with attention whose points name H and span enough shapes (several
 * T and B), also the attention terms: saved = c * B*T*D*b + c_attention *
 * B*H*T^2*b + c_mask * T^2 + fixed (or without c_mask when the points do not
 * separate it); for lm_head, c * B*T*D*b + c_positions * T + fixed; and, when
 * the points span two or more D, + c_tokens * B*T for every kind. Call after adding points. Returns ML_OK or ML_RANGE (a kind with
 * fewer than 2 distinct shapes). */
ML_API ml_status ml_profile_fit(ml_profile *p, ml_error *err);

typedef struct ml_profile_kind {
    const char *kind;
    size_t npoints;
    const ml_profile_point *points;
    ml_linfit fit;    /* x = B*T*D*b, y = saved bytes: slope = c, fixed = fixed bytes;
                         r2 and max_rel_residual are those of the whole fit */
    double attn;      /* c_attention: bytes per B*H*T^2*b element; 0 when not fitted */
    double mask;      /* c_mask: bytes per T^2 element whatever B (a causal mask kept per
                         block); 0 when not fitted */
    double pos;       /* c_positions: bytes per position whatever B (lm_head's position
                         ids); 0 when not fitted */
    double tokens;    /* c_tokens: bytes per token whatever D (the norms' statistics,
                         int64 ids); fitted only from points at two or more D, else 0
                         (then folded into c at the measured D) */
} ml_profile_kind;

/* The fitted saved bytes of kind k at a shape (b bytes per element). */
ML_API double ml_profile_kind_saved(const ml_profile_kind *k, uint64_t B, uint64_t T, uint64_t D,
                                    uint64_t H, unsigned b);

ML_API size_t ml_profile_kind_count(const ml_profile *p);
ML_API const ml_profile_kind *ml_profile_kind_at(const ml_profile *p, size_t i);
/* NULL when the profile has no such kind. */
ML_API const ml_profile_kind *ml_profile_find(const ml_profile *p, const char *kind);
/* Bytes per element the profile was measured in (4 fp32, 2 bf16). */
ML_API unsigned ml_profile_dtype_bytes(const ml_profile *p);
/* Best measured GEMM throughput (TFLOP/s) and its fraction of the peak (0
 * when the peak is unknown). */
ML_API double ml_profile_achieved_tflops(const ml_profile *p);
/* Why the profile's measured throughput does not time a plan under cfg
 * (static text), or NULL when it does: it must have been measured on the
 * plan's device (no device given, or a named device whose driver name is
 * the profile's "device") at the plan's compute dtype (docs/devices.md). */
struct ml_config;
ML_API const char *ml_profile_time_mismatch(const ml_profile *p, const struct ml_config *cfg);
ML_API double ml_profile_efficiency(const ml_profile *p);
ML_API size_t ml_profile_gemm_count(const ml_profile *p);
ML_API const ml_profile_gemm *ml_profile_gemm_at(const ml_profile *p, size_t i);

/* YAML in and out (docs/calibration.md). */
ML_API int ml_profile_write(FILE *f, const ml_profile *p);
ML_API ml_status ml_profile_load_string(const char *text, size_t len, const char *name,
                                        ml_profile **out, ml_error *err);
ML_API ml_status ml_profile_load_file(const char *path, ml_profile **out, ml_error *err);

#ifdef __cplusplus
}
#endif
#endif
