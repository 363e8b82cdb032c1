/* Flags that apply but that nothing would use, refused rather than
 * ignored once they are set: a sequence length the model fixes itself,
 * DeepSpeed's bucket sizes without ZeRO (options.c, ml_cli_load). */
#include <string.h>

#include "cli/cli.h"

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

/* DeepSpeed's bucket sizes where nothing uses them: without ZeRO the
 * plan's gradients are DDP's, and only --emit deepspeed writes them. A
 * model file's key is refused at its line and column once the flags
 * apply (a flag may give the ZeRO it sizes). */
static int bucket_flags(const ml_cli_opts *o, const ml_model *m, const ml_training *t)
{
    /* used: with ZeRO, by --emit deepspeed, by fit's layout search where
     * it picks the sharding itself, and by triage's ZeRO remedies (over
     * data-parallel ranks); Megatron's distributed optimizer has buffers
     * of its own */
    const bool searched = o->gpus && !o->zero && !o->dist_optimizer;
    const bool remedies = o->verb && !strcmp(o->verb, "triage") && t->data_parallel > 1;
    if (t->zero || searched || remedies || (o->emit && !strcmp(o->emit, "deepspeed")))
        return 0;
    const char *f = o->reduce_bucket ? "--reduce-bucket-size"
                    : o->allgather_bucket ? "--allgather-bucket-size"
                                          : NULL;
    if (f) {
        ml_cli_errorf("%s: sizes DeepSpeed's ZeRO buckets (--zero 1 to 3), and the plan has no "
                      "ZeRO: its gradients are DDP's; drop %s, or give --zero (or --emit "
                      "deepspeed, which writes it)",
                      f, f);
        return ML_EXIT_BAD_INPUT;
    }
    static const char *const keys[] = {"training.reduce_bucket_size",
                                       "training.allgather_bucket_size"};
    for (size_t k = 0; k < 2; k++) {
        ml_error e;
        memset(&e, 0, sizeof e);
        if (!ml_model_key_position(m, keys[k], &e.line, &e.col))
            continue;
        /* with --hf, training: comes from --training */
        snprintf(e.path, sizeof e.path, "%s",
                 o->hf ? (o->training ? o->training : o->hf) : o->model_path);
        e.code = ML_SCHEMA;
        snprintf(e.msg, sizeof e.msg,
                 "%s: sizes DeepSpeed's ZeRO buckets (training.zero 1 to 3, --zero), and the "
                 "plan has no ZeRO: its gradients are DDP's; remove the key, or give ZeRO (or "
                 "--emit deepspeed, which writes it)",
                 keys[k]);
        ml_cli_print_error(&e);
        return ML_EXIT_BAD_INPUT;
    }
    return 0;
}

int ml_cli_unused_flags(const ml_cli_opts *o, const ml_model *m, const ml_training *t)
{
    int rc = fixed_seq_flags(o, m, t);
    return rc ? rc : bucket_flags(o, m, t);
}
