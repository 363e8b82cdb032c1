/* Shared by the report writers. */
#ifndef ML_REPORT_INTERNAL_H
#define ML_REPORT_INTERNAL_H

#include <stdio.h>

#include "memledger/report.h"
#include "util/utf8.h" /* ml_json_put_string: a JSON string, UTF-8 kept */

/* The verdict a report states when a length distribution decides it
 * (docs/lengths.md, "The verdict"): fits when every batch the batching
 * produces fits (P(over) = 0), the headroom the tightest planned batch's:
 * min(budget - peak, memory - device total) over the rows reported. */
typedef struct ml_report_verdict {
    bool fits;
    int64_t headroom;
    double p_over;                        /* the probability a batch goes over */
    uint64_t worst_micro_batch, worst_seq_len; /* the batch of that headroom */
} ml_report_verdict;

/* v from a lengths result planned on a device (lengths.c). */
void ml__report_lengths_verdict(const ml_lengths_result *r, ml_report_verdict *v);

/* ml_report_text with the verdict v (NULL: the plan's own) (text.c). */
int ml__report_text_verdict(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l,
                            const ml_report_verdict *v);

/* The plan's JSON object (ml_report_json) without its closing brace, for
 * the writers that add keys after it; v as ml__report_text_verdict. */
void ml__report_json_open(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l);
void ml__report_json_open_verdict(FILE *f, const ml_model *m, const ml_config *cfg,
                                  const ml_ledger *l, const ml_report_verdict *v);

/* ", tp 2 with sequence parallelism, pp 4 (1f1b)" for a model split over
 * devices, "" for one that is not: what a header names (ranks.c). */
void ml__report_layout(const ml_training *t, char *buf, size_t size);
/* A layout search row's layout in the compact form, tp2.cp2.pp4[7..7].dp8
 * (report/layouts.c). */
struct ml_layout_row;
void ml__report_layout_name(const struct ml_layout_row *r, char *buf, size_t size);
/* The plan header's engine, parallel and sharding lines (ranks.c). */
void ml__report_text_parallel(FILE *f, const ml_training *t);
/* For a model split over devices (tp, pp, cp or ep above 1), its layout in
 * --parallel's notation for a settings line (", parallel tp2.pp4.dp2 (16
 * devices; figures are one rank's, ...)"); else "". */
void ml__report_layout_brief(const ml_training *t, char *buf, size_t size);

/* A pipeline's stages (ranks.c): the text table (nothing without one),
 * and JSON's ",\n \"ranks\": [...], \"worst_rank\": N" (null, null without). */
void ml__report_text_ranks(FILE *f, const ml_config *cfg, const ml_ledger *l, bool all);
/* ml_report_text with every pipeline stage in its table (plan --ranks all;
 * else the first, the second, the fullest, a middle one and the last). */
int ml__report_text_all_ranks(FILE *f, const ml_model *m, const ml_config *cfg,
                              const ml_ledger *l);
void ml__report_json_ranks(FILE *f, const ml_config *cfg, const ml_ledger *l);

/* "seq_len N" and, for an encoder-decoder, ", target_len M"; a sequential
 * model's "input A x B" (lengths.c). */
void ml__report_lengths(const ml_model *m, const ml_training *t, char *out, size_t size);
/* What device d's budget line holds, in words: "reserved peak" (the
 * simulated cache's), "allocator peak with the allowance" (a fragmentation
 * allowance takes the simulation's place) or "allocator peak". */
const char *ml__report_budget_holds(const ml_device *d);

/* The category's name for a person (text, SVG, HTML: "master weights",
 * "saved activations"); ml_category_name is its key in JSON and CSV
 * ("master_params", "activations_saved"), a contract (text.c). */
const char *ml__report_category_label(ml_category c);

/* The model states on a device: params + master weights + grads + optimizer
 * states (bytes, per device as the summary's figures), and that over the
 * model's parameter count (bytes per parameter; 0 without parameters)
 * (text.c; docs/ledger.md, "Each phase's peak"). */
uint64_t ml__report_model_states(const ml_summary *s);
double ml__report_model_states_per_param(const ml_summary *s);

/* The plan's calibration line without its line end (cfg->calib not NULL):
 * "calibration: profile NAME (DEVICE, PRECISION): measured c = C for N
 * blocks (marked *; measured at this seq_len and hidden)" or "analytic c,
 * since WHY", then "; step time ..." (text.c; the text and the HTML). */
void ml__report_calibration(FILE *f, const ml_config *cfg, const ml_summary *s);

/* v with a comma every three digits: "124,439,808" (text.c). */
void ml__report_commas(uint64_t v, char *buf, size_t size);

/* --emit's verdict on a plan (docs/hf.md, "--emit"). */
enum { ML_EMIT_EXACT = 0, ML_EMIT_PARTIAL = 1, ML_EMIT_REFUSED = 2 };

/* Whether target `kind` ("deepspeed", "hf-trainer", "torch") carries the
 * plan l, evaluated from cfg. Returns ML_EMIT_EXACT; ML_EMIT_PARTIAL: the
 * settings are written, but a part of the plan is the model's or the loop's
 * code, which they cannot hold (why: the notes, "; "-separated; they are
 * also comments in the torch and hf-trainer outputs); ML_EMIT_REFUSED: the
 * target would run a different setup, nothing may be written (why: the
 * reason); -2 for an unknown kind. why (size bytes) is always terminated
 * when size > 0. ml_report_emit() returns -3 for a refused plan, writing
 * nothing. */
int ml__report_emit_check(const char *kind, const ml_model *m, const ml_config *cfg,
                          const ml_ledger *l, char *why, size_t size);

#endif
