/* memledger command line: shared pieces of the verbs. */
#ifndef ML_CLI_H
#define ML_CLI_H

#include <stdbool.h>
#include <stdio.h>

#include "memledger/memledger.h"

/* Exit statuses: a contract (docs/cli.md). */
enum {
    ML_EXIT_OK = 0,        /* ran; fits when a device was given */
    ML_EXIT_NO_FIT = 1,    /* ran; does not fit */
    ML_EXIT_BAD_INPUT = 2, /* bad model file, flag or value */
    ML_EXIT_FAILURE = 3,   /* output could not be written, out of memory */
};

typedef enum { ML_FMT_TEXT, ML_FMT_JSON, ML_FMT_CSV, ML_FMT_SVG, ML_FMT_TRACE } ml_format;

/* Training/device overrides as given on the command line, applied on top
 * of the model file's settings. */
typedef struct {
    const char *model_path;
    const char *output;   /* -o FILE; NULL: standard output */
    const char *hf;       /* --hf config.json instead of a model file */
    const char *training; /* --training FILE.yaml with --hf */
    const char *emit;     /* --emit deepspeed|hf-trainer|torch (plan, fit) */
    const char *calib;    /* --calib PROFILE.yaml */
    bool format_given;
    ml_format format;
    /* raw flag values, NULL when not given */
    const char *micro_batch, *seq_len, *grad_accum, *precision, *optimizer, *optimizer_impl,
        *checkpoint, *device, *budget, *runtime_reserve, *peak_tflops, *efficiency, *fragmentation,
        *data_parallel, *zero, *offload, *global_batch, *max_micro_batch, *reduce_bucket,
        *allgather_bucket, *logits, *eval_batch, *eval_seq_len, *allocator, *max_split_size, *allocator_start,
        *blas_workspace,
        *zero_grad, *interconnect, *pcie, *logits_chunk, *attention, *expert_imbalance, *expert_capacity, *target_len,
        *vision_tower;
    /* length distributions (plan, fit, triage): --lengths FILE|QUANTILES, --batching,
     * --max-tokens N|auto, --buckets K */
    const char *lengths, *batching, *max_tokens, *buckets;
    /* the parallel layout: --parallel LAYOUT, --tp N, --sp / --no-sp ("on",
     * "off"), and the splits not modelled yet (refused above 1) */
    const char *engine; /* --engine eager|megatron */
    const char *gpus, *gpus_per_node, *network; /* fit's layout search */
    bool exhaustive;                             /* fit --gpus: plan every point */
    const char *ranks; /* plan --ranks all: every pipeline stage in the table */
    const char *parallel, *tp, *sp, *pp, *vpp, *cp, *ep, *etp, *pp_schedule, *micro_batches,
        *pp_layers;
    bool auto_checkpoint; /* --checkpoint auto (fit) */
    const char *dist_optimizer; /* --dist-optimizer "on", --no-dist-optimizer "off" */
    const char *dp_shard;       /* --dp-shard N: HSDP's shard group */
    const char *overlap;        /* --overlap-grad-reduce "on" */
    const char *expert_pad;     /* --expert-pad "on" */
    const ml_model *model; /* the loaded model (ml_cli_start): where its file set a
                              key, for the messages about it (ml_cli_config_error) */
    const char *verb;      /* the verb parsed for ("plan", "fit", ...; ml_cli_parse) */
} ml_cli_opts;

/* The parallel-layout flags over t (parallel_flags.c): 0, or the exit
 * status of the first bad one (its message printed). */
int ml_cli_parallel_flags(const ml_cli_opts *o, ml_training *t);

/* A value flag and the offset of its raw value in ml_cli_opts
 * (flag_table.c). */
typedef struct {
    const char *flag;
    size_t off;
} ml_cli_flag;
const ml_cli_flag *ml_cli_flags(size_t *count);

/* Parses argv (after the verb). Returns 0, 1 for --help (printed), or 2 on a
 * usage error (printed). */
int ml_cli_parse(int argc, char **argv, const char *verb, const char *const *usage,
                 ml_cli_opts *o);
/* A verb's usage: its parts (string literals, NULL-terminated: C99 promises
 * 4,095 bytes a literal) one after the other. */
void ml_cli_print_usage(const char *const *usage, FILE *f);
/* Whether arg is the flag name, alone or as "name=VALUE". */
bool ml_cli_is_flag(const char *arg, const char *name);
/* Whether argv[*i] (arg) is the flag name, as "name VALUE" or
 * "name=VALUE"; then *val is the value, NULL when there is none (the next
 * argument missing, or itself a flag: "-" and negative numbers are values),
 * and *i is past a value taken from the next argument. */
bool ml_cli_flag_is(const char *arg, const char *name, int argc, char **argv, int *i,
                    const char **val);
/* Parses a whole-number flag value; prints and returns 2 on error. */
int ml_cli_whole(const char *flag, const char *v, uint64_t lo, uint64_t hi, uint64_t *out);
/* --max-split-size's value: a whole number of MiB, 20 to 2^40, as PyTorch's
 * max_split_size_mb (a unit after it is refused, saying so). */
int ml_cli_max_split(const char *v, uint64_t *mib);
/* The flags set that nothing would use, refused (flag_checks.c): a
 * sequence length the model fixes, bucket sizes without ZeRO. 0, or the
 * exit status with the message printed. */
int ml_cli_unused_flags(const ml_cli_opts *o, const ml_model *m, const ml_training *t);
/* Parses argv and loads the model: returns true when the verb goes on (m and
 * cfg set), false when it is done (help printed, or an error) with *rc the
 * exit status. */
bool ml_cli_start(int argc, char **argv, const char *verb, const char *const *usage, ml_cli_opts *o,
                  ml_model **m, ml_config *cfg, int *rc);
/* Loads the model and applies overrides; prints errors. Returns 0 or an exit status. */
int ml_cli_load(const ml_cli_opts *o, ml_model **m, ml_config *cfg);
/* Reports a failed evaluation of the model in o (the message names the
 * file, with no position) and returns the exit status for st. */
int ml_cli_eval_failed(const ml_cli_opts *o, ml_error *e, ml_status st);
/* The flag of a library key ("training.micro_batch" -> "--micro-batch"),
 * or NULL (src/cli/flags.c holds the table). */
const char *ml_cli_flag_of(const char *key);
/* Rewrites a library message in place in the flags' words: each key in it
 * becomes its flag, except a leading "KEY:" (the subject) whose value came
 * from the model file. True when the subject is a flag the user gave. */
bool ml_cli_decorate(const ml_cli_opts *o, char *msg, size_t size);
/* Prints a library error about the configuration, decorated: the subject
 * is a flag, or the key with the model file's name before it. */
void ml_cli_config_error(const ml_cli_opts *o, ml_error *e);
/* Frees what ml_cli_load made: the model, the calibration profile and the
 * allocator's start trace. */
void ml_cli_free(ml_model *m, ml_config *cfg);
/* --allocator-start PATH (NULL: nothing) read into d->start, which
 * ml_cli_free destroys (refused when d simulates no allocator): 0, or the
 * exit status with the error printed. */
int ml_cli_load_start(const char *path, ml_device *d);
/* Prints "memledger: error: path:line:col: msg", the line and a caret. */
void ml_cli_print_error(const ml_error *e);

/* Atomic output (output.c): open a temporary beside path (or stdout for
 * NULL, "-" or a path naming standard output), then rename on success or
 * remove on failure. A device or FIFO (also through a symbolic link) is
 * written in place; a link to a regular file has its target replaced. */
typedef struct {
    FILE *f;
    bool direct; /* a device or pipe, written in place */
    FILE *raw;   /* with ml_out_text: the real stream; f buffers the text */
    char *text;
    size_t text_len;
    const char *names[4]; /* with ml_out_text: each shown on one line wherever it occurs */
    char tmp[4096];
    char path[4096];
} ml_out;
int ml_out_open(ml_out *o, const char *path);
/* Prose for people (after ml_out_open): control bytes other than newline
 * and tab reach the output as visible \xNN escapes, so a name from a model
 * file cannot drive the reader's terminal. name (or NULL), a string from the
 * input such as a file name, alive until ml_out_close, has its newlines
 * escaped too wherever it occurs: it cannot forge a line of the report.
 * Returns 0, or 3 with the output closed and the message printed. */
int ml_out_text(ml_out *o, const char *name);
/* ml_out_text for a report on m: the model's name and the calibration
 * profile's name, device and precision are the strings kept on one line. */
int ml_out_text_model(ml_out *o, const ml_model *m, const ml_config *cfg);
/* ml_out_open, then, for prose (text), ml_out_text_model: what a verb's
 * report opens. */
int ml_out_open_report(ml_out *o, const char *path, bool text, const ml_model *m,
                       const ml_config *cfg);
/* ok: the writer succeeded. Returns 0 or an exit status (message printed). */
int ml_out_close(ml_out *o, bool ok);
/* 2 (printed) when out and in name the same existing file (device and
 * inode): an output must never replace an input. NULL and "-" never match. */
int ml_out_refuse_input(const char *out, const char *in);
/* s to f with control bytes (C0 other than tab, DEL, and C1 encoded in
 * UTF-8) as \xNN escapes; newlines kept when lines (prose), else escaped
 * (a one-line message, where a name must not start a forged line). */
void ml_cli_put_safe(FILE *f, const char *s, size_t len, bool lines);
/* "memledger: error: " and the message, made safe by ml_cli_put_safe, to stderr. */
void ml_cli_errorf(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* plan and fit with --lengths (cmd_lengths.c): the whole verb's output
 * and exit status; l is the plan at the config's own shape (plan). */
int ml_cli_plan_lengths(const ml_cli_opts *o, const ml_model *m, const ml_config *cfg,
                        const ml_ledger *l);
int ml_cli_fit_lengths(const ml_cli_opts *o, const ml_model *m, const ml_config *cfg);
/* triage's --lengths: the distribution (*d, NULL without --lengths; the
 * caller destroys it) and the request; 0 or an exit status (message
 * printed). --max-tokens auto is refused: the token-budget remedy is it. */
int ml_cli_triage_lengths(const ml_cli_opts *o, ml_lengths **d, ml_lengths_request *req);
/* A failed ml_lengths_plan / ml_triage with lengths: the message, and exit
 * 2 for a model without a sequence or lengths beyond its positions. */
int ml_cli_lengths_failed(const ml_cli_opts *o, ml_error *e, ml_status st);

int ml_cmd_plan(int argc, char **argv);
int ml_cmd_timeline(int argc, char **argv);
int ml_cmd_report(int argc, char **argv);
int ml_cmd_calibrate(int argc, char **argv);
int ml_cmd_fit(int argc, char **argv);
int ml_cmd_compare(int argc, char **argv);
int ml_cmd_allocator(int argc, char **argv);
int ml_cmd_triage(int argc, char **argv);
int ml_cmd_colocate(int argc, char **argv);
int ml_cmd_devices(int argc, char **argv);

#endif
