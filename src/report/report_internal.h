/* Shared by the report writers. */
#ifndef ML_REPORT_INTERNAL_H
#define ML_REPORT_INTERNAL_H

#include <stdio.h>

#include "memledger/report.h"
#include "util/utf8.h" /* ml_json_put_string: a JSON string, UTF-8 kept */

/* The plan's JSON object (ml_report_json) without its closing brace, for
 * the writers that add keys after it. */
void ml_report_json_open(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l);

/* "seq_len N" and, for an encoder-decoder, ", target_len M" (text.c). */
void ml_report_lengths(const ml_model *m, const ml_training *t, char *out, size_t size);

/* The category's name for a person (text, SVG, HTML: "master weights",
 * "saved activations"); ml_category_name is its key in JSON and CSV
 * ("master_params", "activations_saved"), a contract (text.c). */
const char *ml_report_category_label(ml_category c);

/* v with a comma every three digits: "124,439,808" (text.c). */
void ml_report_commas(uint64_t v, char *buf, size_t size);

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
int ml_report_emit_check(const char *kind, const ml_model *m, const ml_config *cfg,
                         const ml_ledger *l, char *why, size_t size);

#endif
