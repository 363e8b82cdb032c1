/* Flags that apply but that nothing would use, refused rather than
 * ignored once they are set: a sequence length the model fixes itself,
 * DeepSpeed's bucket sizes without ZeRO (options.c, ml_cli_load). */
#include <string.h>

#include "cli/cli.h"
#include "model/model_internal.h"

/* --seq-len and --eval-seq-len where the model fixes its sequence
 * (ml_model_check_seq), in the flags' words. */
static int fixed_seq_flags(const ml_cli_opts *o, const ml_model *m, const ml_training *t)
{
    ml_error e;
    memset(&e, 0, sizeof e);
    if (ml_model_check_seq(m, t, &e) == ML_OK)
        return 0;
    ml_cli_decorate(o, e.msg, sizeof e.msg);
    ml_cli_errorf("%s", e.msg);
    return ML_EXIT_BAD_INPUT;
}

/* DeepSpeed's bucket sizes where nothing uses them (ml__model_check_buckets:
 * a flag's, or the model file's key, located there once the flags apply).
 * Used with ZeRO, by --emit deepspeed, by fit's layout search where it
 * picks the sharding itself and by triage's ZeRO remedies over
 * data-parallel ranks. */
static int bucket_flags(const ml_cli_opts *o, const ml_model *m, const ml_training *t)
{
    const bool searched = o->gpus && !o->zero && !o->dist_optimizer;
    const bool remedies = o->verb && !strcmp(o->verb, "triage") && t->data_parallel > 1;
    if (searched || remedies || (o->emit && !strcmp(o->emit, "deepspeed")))
        return 0;
    const char *given = o->reduce_bucket      ? "training.reduce_bucket_size"
                        : o->allgather_bucket ? "training.allgather_bucket_size"
                                              : NULL;
    ml_error e;
    memset(&e, 0, sizeof e);
    if (ml__model_check_buckets(m, t, given, &e) == ML_OK)
        return 0;
    ml_cli_opts at = *o; /* the message in the flags' words, or at the file's key */
    at.model = m;
    ml_cli_config_error(&at, &e);
    return ML_EXIT_BAD_INPUT;
}

int ml_cli_unused_flags(const ml_cli_opts *o, const ml_model *m, const ml_training *t)
{
    int rc = fixed_seq_flags(o, m, t);
    return rc ? rc : bucket_flags(o, m, t);
}
