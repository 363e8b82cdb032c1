/* memledger — the verbs' JSON reports as strings in memory.
 *
 * For programs and bindings (the Python package, python/) that hold a model
 * and its settings by handle and want the reports docs/cli.md describes,
 * byte for byte what `memledger VERB --format json` prints, without laying
 * out ml_config themselves: the job keeps the value structs on the C side,
 * so a binding does not break when they gain fields. */
#ifndef MEMLEDGER_JSON_H
#define MEMLEDGER_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "export.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A model and the settings to plan it with. */
typedef struct ml_job ml_job;

/* Starts a job on m with the model's own settings (ml_model_config), fit's
 * default request and no calibration profile. m is borrowed: it must outlive
 * the job. On success *out owns the job (ml_job_destroy); on failure *out is
 * unchanged. Returns ML_OK, ML_USAGE (NULL m or out) or ML_NOMEM. */
ML_API ml_status ml_job_create(const ml_model *m, ml_job **out, ml_error *err);

/* Frees the job and the calibration profile it loaded; accepts NULL. */
ML_API void ml_job_destroy(ml_job *j);

/* Sets one setting from its text: every key of ml_config_set (same order
 * rules); "training.checkpoint" also takes "auto" (fit picks the policy;
 * the other verbs refuse it); "global_batch" and "max_micro_batch" (fit's
 * request, whole numbers as the flags take them); "calib", the path of a
 * calibration profile, loaded now and owned by the job (a second one
 * replaces the first). On failure the job is unchanged and err says why (a
 * profile's errors name its file and position). Returns ML_OK, ML_USAGE,
 * ML_RANGE, or a profile loader's status (ML_IO, ML_SYNTAX, ML_SCHEMA,
 * ML_NOMEM). */
ML_API ml_status ml_job_set(ml_job *j, const char *key, const char *value, ml_error *err);

/* The JSON report of a verb on the job's settings, as the command line's
 * --format json writes it (docs/cli.md): plan (with its "advice"), fit,
 * compare (an array of rows) and timeline (an array of events). The texts
 * that say a setting ("note", "why") name it by its key
 * ("training.micro_batch") where the command line names the flag. On
 * success *out is a NUL-terminated string the caller frees with
 * ml_json_free, and *len (when len is not NULL) its length; on failure
 * *out is unchanged. A plan that does not fit, or a fit where nothing fits,
 * is a report, not a failure. Returns ML_OK; ML_USAGE (fit without a device;
 * "auto" checkpointing outside fit; a setting the verb would not use, which
 * is refused rather than ignored: training.micro_batch set for fit, which
 * searches it, training.checkpoint set for compare, which plans every
 * policy); ML_RANGE, ML_OVERFLOW, ML_NOMEM as ml_ledger_evaluate. */
ML_API ml_status ml_job_plan_json(const ml_job *j, char **out, size_t *len, ml_error *err);
ML_API ml_status ml_job_fit_json(const ml_job *j, char **out, size_t *len, ml_error *err);
ML_API ml_status ml_job_compare_json(const ml_job *j, char **out, size_t *len, ml_error *err);
ML_API ml_status ml_job_timeline_json(const ml_job *j, char **out, size_t *len, ml_error *err);
/* The timeline drawn as `memledger timeline --format svg` draws it (an SVG
 * document, not JSON), on the job's settings, refused as the timeline's
 * JSON is; ownership, *out and the statuses as above. */
ML_API ml_status ml_job_timeline_svg(const ml_job *j, char **out, size_t *len, ml_error *err);

/* calibrate --points --format json: fits the measured peaks of a CSV held
 * in text (len bytes; name is the path in messages; ml_points_parse_csv
 * reads it), with budget (bytes, 0: none) and at (a micro-batch, 0: none)
 * as --budget and --at. Ownership and *out as above. Returns ML_OK, or the
 * status of ml_points_parse_csv or ml_points_analyse. */
ML_API ml_status ml_points_json(const char *text, size_t len, const char *name, uint64_t budget,
                                uint64_t at, char **out, size_t *out_len, ml_error *err);

/* Frees a string from the functions above; accepts NULL. */
ML_API void ml_json_free(char *s);

#ifdef __cplusplus
}
#endif
#endif
