/* memledger — reports. Writers take a FILE* and never print elsewhere. */
#ifndef MEMLEDGER_REPORT_H
#define MEMLEDGER_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "export.h"
#include "ledger.h"
#include "model.h"
#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Human-readable ledger, binary units. Returns 0, or -1 on a write error. */
ML_API int ml_report_text(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l);
/* One JSON object (docs/cli.md lists the keys). Returns 0 or -1. */
ML_API int ml_report_json(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l);

/* fit: text and JSON (docs/cli.md). Return 0 or -1 on a write error. */
ML_API int ml_report_fit_text(FILE *f, const ml_model *m, const ml_config *cfg,
                              const ml_fit_request *req, const ml_fit_result *r);
ML_API int ml_report_fit_json(FILE *f, const ml_model *m, const ml_fit_request *req,
                              const ml_fit_result *r);
/* compare: text, JSON (an array) and CSV (with a header row). */
ML_API int ml_report_compare_text(FILE *f, const ml_model *m, const ml_config *cfg,
                                  const ml_compare_row *rows, size_t n);
ML_API int ml_report_compare_json(FILE *f, const ml_compare_row *rows, size_t n);
ML_API int ml_report_compare_csv(FILE *f, const ml_compare_row *rows, size_t n);

/* "1.50 GiB", "512.00 MiB", "12 B": binary units, two decimals. */
ML_API void ml_format_bytes(uint64_t bytes, char *buf, size_t size);
/* "12.3 TFLOP", "4.56 GFLOP": decimal prefixes, as FLOPs always are. */
ML_API void ml_format_flops(double flops, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif
