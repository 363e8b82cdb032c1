/* memledger — planning for what varies: a distribution of sample lengths
 * instead of one seq_len. With padded batches the peak follows the longest
 * sample of each batch; a token budget (max_tokens) trades micro-batch for
 * length; buckets group similar lengths. docs/lengths.md derives every
 * figure. */
#ifndef MEMLEDGER_LENGTHS_H
#define MEMLEDGER_LENGTHS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "export.h"
#include "ledger.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A distribution of sample lengths (tokens per sample): counted samples
 * from a CSV, or quantiles interpolated linearly. Immutable once built. */
typedef struct ml_lengths ml_lengths;

/* A CSV of lengths: one length per line, or `length,count` lines; an
 * optional header line (`length`, or `length` and `count` in either order:
 * the fields are read as it names them; other names are refused), `#`
 * comments and blank lines. name is used in messages (file:line:column). Lengths are 1 to
 * 2^28, counts 1 to 2^40; at least one sample. */
ML_API ml_status ml_lengths_parse_csv(const char *text, size_t len, const char *name,
                                      ml_lengths **out, ml_error *err);
/* Reads path and parses it as ml_lengths_parse_csv. */
ML_API ml_status ml_lengths_load(const char *path, ml_lengths **out, ml_error *err);
/* Quantiles: "p50=120,p90=300,p99=480,max=512" — pNN (0 < NN < 100,
 * decimals allowed: p99.9), min= and max= (max required; min defaults to 1);
 * lengths non-decreasing with the quantile. The CDF is linear between them. */
ML_API ml_status ml_lengths_parse_quantiles(const char *spec, ml_lengths **out, ml_error *err);
/* Accepts NULL. */
ML_API void ml_lengths_destroy(ml_lengths *d);

/* P(L <= t). */
ML_API double ml_lengths_cdf(const ml_lengths *d, uint64_t t);
/* The smallest length t with P(L <= t) >= p (0 < p <= 1). */
ML_API uint64_t ml_lengths_quantile(const ml_lengths *d, double p);
/* The longest of b samples drawn at random: the smallest t with
 * P(max <= t) = F(t)^b >= p. */
ML_API uint64_t ml_lengths_batch_max_quantile(const ml_lengths *d, uint64_t b, double p);
/* The longest length at most t that a sample can have; 0 when none. */
ML_API uint64_t ml_lengths_floor(const ml_lengths *d, uint64_t t);
ML_API uint64_t ml_lengths_min(const ml_lengths *d);
ML_API uint64_t ml_lengths_max(const ml_lengths *d);
/* Samples counted (CSV), 0 for quantiles. */
ML_API uint64_t ml_lengths_samples(const ml_lengths *d);

typedef enum ml_batching {
    ML_BATCHING_PADDED,   /* random batches padded to their longest sample */
    ML_BATCHING_BUCKETED, /* batches drawn from length buckets */
    ML_BATCHING_PACKED    /* samples packed into rows of seq_len tokens */
} ml_batching;

/* "padded", "bucketed", "packed". */
ML_API const char *ml_batching_name(ml_batching b);
ML_API bool ml_batching_parse(const char *s, ml_batching *out);

#define ML_LENGTHS_MAX_BUCKETS 16

typedef struct ml_lengths_request {
    ml_batching batching;
    uint64_t max_tokens; /* a token budget per batch: micro-batch floor(N / T_max)
                            (at least 1); 0: the config's micro-batch */
    unsigned buckets;    /* bucketed: how many (default 4, at most 16) */
} ml_lengths_request;

ML_API ml_lengths_request ml_lengths_request_defaults(void);

/* One planned batch shape. */
typedef struct ml_length_point {
    uint64_t micro_batch;
    uint64_t seq_len;    /* its longest sample (the padded length) */
    uint64_t peak;       /* the binding allocator peak (ml_summary.binding) */
    uint64_t peak_total; /* with fragmentation and the runtime reserve */
    bool fits;           /* false too without a device */
    int64_t headroom;    /* the plan's (ml_summary.headroom); 0 without a device */
} ml_length_point;

typedef struct ml_length_bucket {
    uint64_t lo, hi;        /* lengths lo..hi */
    double share;           /* of the samples */
    ml_length_point point;  /* at hi, with the largest micro-batch that fits
                               (the config's without a device) */
} ml_length_bucket;

typedef struct ml_lengths_result {
    ml_length_point p50, p99, max; /* the median, P99 and worst batch (with a
                                      device the tightest of all the rows:
                                      docs/lengths.md) */
    uint64_t longest_fit;          /* padded at a fixed micro-batch: the longest
                                      batch length that fits (0: none does) */
    double p_over_budget;          /* the probability that a batch goes over
                                      the device (0 to 1; NaN without a device) */
    size_t nbuckets;
    ml_length_bucket buckets[ML_LENGTHS_MAX_BUCKETS];
    unsigned evaluations;          /* ledger evaluations made */
} ml_lengths_result;

/* Plans cfg under the length distribution d (docs/lengths.md). The model
 * must have a sequence (a decoder or an encoder). ML_USAGE for a sequential
 * model, ML_RANGE for lengths beyond the model's positions (the message
 * says which), else as ml_ledger_evaluate. */
ML_API ml_status ml_lengths_plan(const ml_model *m, const ml_config *cfg, const ml_lengths *d,
                                 const ml_lengths_request *req, ml_lengths_result *out,
                                 ml_error *err);

/* The largest token budget a search may answer for d: batches of the
 * shortest samples within the micro-batch limit (2^24 samples), at most
 * 2^34 tokens. */
ML_API uint64_t ml_lengths_budget_limit(const ml_lengths *d);

/* The largest token budget N (at most ml_lengths_budget_limit) whose worst batch fits the
 * device (padded batches of floor(N / T) samples): ML_OK with *tokens 0 when
 * even one sample of the longest length does not fit; ML_USAGE without a
 * device. *evaluations counts the ledger evaluations (may be NULL). */
ML_API ml_status ml_lengths_fit_tokens(const ml_model *m, const ml_config *cfg,
                                       const ml_lengths *d, uint64_t *tokens,
                                       unsigned *evaluations, ml_error *err);

/* The same, and that budget's plan into *out (as ml_lengths_plan with
 * padded batches and max_tokens *tokens), from the points the search
 * planned: each shape simulated once. *out is untouched when *tokens is 0;
 * out->evaluations counts the search's evaluations too. */
ML_API ml_status ml_lengths_fit_tokens_plan(const ml_model *m, const ml_config *cfg,
                                            const ml_lengths *d, uint64_t *tokens,
                                            ml_lengths_result *out, ml_error *err);

#ifdef __cplusplus
}
#endif

#endif
