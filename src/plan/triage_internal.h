/* What triage's entry point and ranking (triage.c) and its remedies
 * (triage_remedies.c) share. Internal to src/plan/. The rules: docs/cli.md,
 * "triage". */
#ifndef ML_TRIAGE_INTERNAL_H
#define ML_TRIAGE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memledger/plan.h"

/* What a model has that decides whether a remedy applies or what it changes
 * in training. */
typedef struct {
    bool transformer; /* decoder/encoder shorthand: its attention is m->attn.kernel */
    bool attention;   /* any attention (selective checkpointing acts on it) */
    bool dropout;     /* recomputed dropout needs the RNG state */
    bool batchnorm;   /* batch statistics depend on the micro-batch */
} ml_triage_traits;

/* One triage: the configuration as given and what it found so far. */
typedef struct {
    const ml_model *m;
    const ml_config *cfg;           /* as given */
    const ml_triage_request *req;
    const ml_triage_result *r;      /* current, observed */
    ml_triage_traits tr;
    ml_error *err;
    const ml_config *given;         /* cfg before a length distribution's worst batch
                                       set its micro-batch and seq_len (= cfg without) */
} ml_triage_ctx;

/* c's summary (ml_ledger_evaluate without events); its statuses. */
ml_status ml__triage_evaluate(const ml_model *m, const ml_config *c, ml_summary *out,
                              ml_error *err);
/* s's step time with offload's host transfers counted without overlap; < 0
 * when unknown. */
double ml__triage_step_time(const ml_triage_ctx *x, const ml_summary *s);
/* Plans remedy k and appends it to r when it applies and lowers the peak
 * total (expandable segments also when the run was seen fragmented).
 * ML_OK, or an evaluation's status other than ML_OVERFLOW. */
ml_status ml__triage_add_remedy(const ml_triage_ctx *x, ml_remedy_kind k, ml_triage_result *r);
/* Appends to the string in buf, truncating at size. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
void ml__triage_put(char *buf, size_t size, const char *fmt, ...);
/* Whether remedy k acts on the phase the run failed in (req->oom_phase). */
bool ml__triage_in_focus(const ml_triage_ctx *x, ml_remedy_kind k);

/* triage_lengths.c: with req->lengths, plans cfg's batches into r->lengths
 * and sets *worst's micro-batch and seq_len to the worst batch's;
 * ml_lengths_plan's statuses. */
ml_status ml__triage_worst_batch(const ml_model *m, const ml_config *cfg,
                                 const ml_triage_request *req, ml_triage_result *r,
                                 ml_config *worst, ml_error *err);
/* Whether every batch has the config's micro-batch (no lengths, padded
 * without a token budget, packed): the micro-batch remedy applies. */
bool ml__triage_fixed_micro_batch(const ml_triage_request *req);
/* The token-budget and length-buckets remedies (k), as ml__triage_add_remedy. */
ml_status ml__triage_add_lengths_remedy(const ml_triage_ctx *x, ml_remedy_kind k,
                                        ml_triage_result *r);

#endif
