/* memledger — reports. Writers take a FILE* and never print elsewhere. */
#ifndef MEMLEDGER_REPORT_H
#define MEMLEDGER_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "calib.h"
#include "export.h"
#include "ledger.h"
#include "lengths.h"
#include "model.h"
#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Human-readable ledger, binary units. Returns 0, or -1 on a write error. */
ML_API int ml_report_text(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l);
/* One JSON object (docs/cli.md lists the keys). Returns 0 or -1. */
ML_API int ml_report_json(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l);

/* A plan under a length distribution (docs/lengths.md): the text section
 * that follows ml_report_text's report, and the JSON object of the plan
 * with a "lengths" key. Return 0 or -1 on a write error. */
ML_API int ml_report_lengths_text(FILE *f, const ml_config *cfg, const ml_lengths *d,
                                  const char *source, const ml_lengths_request *req,
                                  const ml_lengths_result *r);
ML_API int ml_report_json_lengths(FILE *f, const ml_model *m, const ml_config *cfg,
                                  const ml_ledger *l, const ml_lengths *d,
                                  const ml_lengths_request *req, const ml_lengths_result *r);
/* The "lengths" object alone: {"p50_peak", "p99_peak", "max_peak",
 * "p_over_budget", ...}. */
ML_API int ml_report_lengths_json_object(FILE *f, const ml_lengths *d,
                                         const ml_lengths_request *req,
                                         const ml_lengths_result *r);

/* fit: text and JSON (docs/cli.md). Return 0 or -1 on a write error. */
ML_API int ml_report_fit_text(FILE *f, const ml_model *m, const ml_config *cfg,
                              const ml_fit_request *req, const ml_fit_result *r);
ML_API int ml_report_fit_json(FILE *f, const ml_model *m, const ml_fit_request *req,
                              const ml_fit_result *r);
/* fit --gpus: the layout search's table (docs/search.md); JSON
 * {"model", "gpus", "gpus_per_node", "global_batch", "layouts": [...], ...}. */
ML_API int ml_report_layouts_text(FILE *f, const ml_model *m, const ml_config *cfg,
                                  const ml_layout_request *req, const ml_layout_result *r);
ML_API int ml_report_layouts_json(FILE *f, const ml_model *m, const ml_layout_request *req,
                                  const ml_layout_result *r);
/* plan's advice when a cheaper checkpoint policy fits too (ml_advice): a
 * line after the text report (nothing without advice), and the plan's JSON
 * with an "advice" key (null without). */
ML_API int ml_report_advice_text(FILE *f, const ml_summary *s, const ml_advice *a);
ML_API int ml_report_json_advice(FILE *f, const ml_model *m, const ml_config *cfg,
                                 const ml_ledger *l, const ml_advice *a);

/* colocate: the jobs (names[j]: how the user gave job j) and ml_colocate's
 * result as text, JSON and an SVG of the jobs started together. */
ML_API int ml_report_colocate_text(FILE *f, const ml_colocate_job *jobs,
                                   const char *const *names, size_t n,
                                   const ml_colocate_result *r);
ML_API int ml_report_colocate_json(FILE *f, const ml_colocate_job *jobs,
                                   const char *const *names, size_t n,
                                   const ml_colocate_result *r);
ML_API int ml_report_colocate_svg(FILE *f, const ml_colocate_job *jobs,
                                  const char *const *names, size_t n,
                                  const ml_colocate_result *r);

/* calibrate --points: the fit of n measured peaks (ml_points_analyse with
 * budget and at; 0: not asked) as one JSON object (docs/cli.md). Returns 0
 * or -1 on a write error. */
ML_API int ml_report_points_json(FILE *f, size_t n, const ml_points_fit *r, uint64_t budget,
                                 uint64_t at);

/* compare: text, JSON (an array) and CSV (with a header row). */
ML_API int ml_report_compare_text(FILE *f, const ml_model *m, const ml_config *cfg,
                                  const ml_compare_row *rows, size_t n);
ML_API int ml_report_compare_json(FILE *f, const ml_compare_row *rows, size_t n);
ML_API int ml_report_compare_csv(FILE *f, const ml_compare_row *rows, size_t n);

/* The event list of a ledger evaluated with keep_events: CSV (header row)
 * or a JSON array. Return 0 or -1 on a write error. */
ML_API int ml_report_timeline_csv(FILE *f, const ml_ledger *l);
ML_API int ml_report_timeline_json(FILE *f, const ml_ledger *l);
/* The allocator simulation's own events (ml_ledger_sim_events) as a trace
 * `memledger allocator` replays: the header action,id,bytes, then
 * `alloc,ID,BYTES`, `free,ID` and a `# ...` line where each pass starts
 * (docs/allocator.md). Return 0 or -1 on a write error. */
ML_API int ml_report_timeline_trace(FILE *f, const ml_ledger *l);
/* SVG: stacked area by category, phase bands, budget and capacity lines,
 * the peak (needs keep_events). */
ML_API int ml_report_timeline_svg(FILE *f, const ml_model *m, const ml_config *cfg,
                                  const ml_ledger *l);
/* SVG: total live bytes of several evaluations (policies) overlaid. */
ML_API int ml_report_compare_svg(FILE *f, const ml_model *m, const ml_config *cfg,
                                 const ml_ledger *const *ls, const char *const *names, size_t n);
/* A self-contained HTML report (no network, no external files): the ledger l
 * (evaluated with keep_events), the comparison rows and, when fit is not
 * NULL, the micro-batch recommendation. Returns 0 or -1. */
ML_API int ml_report_html(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l,
                          const ml_compare_row *rows, size_t nrows, const ml_fit_result *fit);
/* Settings for the plan l (evaluated from cfg): kind "deepspeed" (a
 * DeepSpeed config, JSON), "hf-trainer" (TrainingArguments flags) or "torch"
 * (a PyTorch training-step snippet). Returns 0, -1 on a write error, -2 for
 * an unknown kind. */
ML_API int ml_report_emit(FILE *f, const char *kind, const ml_model *m, const ml_config *cfg,
                          const ml_ledger *l);
/* Writes s with XML/HTML special characters escaped, as characters XML 1.0
 * allows: control bytes dropped; bytes that are not UTF-8, U+FFFE and
 * U+FFFF written U+FFFD. */
ML_API void ml_svg_escape(FILE *f, const char *s);

#ifdef __cplusplus
}
#endif
#endif
