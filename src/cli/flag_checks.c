/* Flags that apply but that nothing would use, refused rather than
 * ignored once they are set: a sequence length the model fixes itself,
 * DeepSpeed's bucket sizes without ZeRO (options.c, ml_cli_load). */
#include <string.h>

#include "cli/cli.h"

/* --seq-len and --eval-seq-len where the model fixes its sequence
 * (ml_model_fixed_seq_len): refused, not ignored. */
static int fixed_seq_flags(const ml_cli_opts *o, const ml_model *m, const ml_training *t)
{
    const uint64_t T = ml_model_fixed_seq_len(m);
    const struct {
        const char *flag;
        bool given;
        uint64_t v;
    } f[] = {{"--seq-len", o->seq_len != NULL, t->seq_len},
             {"--eval-seq-len", o->eval_seq_len != NULL, t->eval_seq_len}};
    for (size_t i = 0; T && i < sizeof f / sizeof f[0]; i++) {
        if (!f[i].given || f[i].v == T)
            continue;
        if (T == 1)
            ml_cli_errorf("%s: %s is a sequential model, whose input shape is model.input "
                          "(no sequence length changes it): drop %s",
                          f[i].flag, ml_model_name(m), f[i].flag);
        else
            ml_cli_errorf("%s: %s is a vision encoder, whose sequence is its image's patches "
                          "and the class token (%llu tokens, set by model.image_size and "
                          "model.patch_size): drop %s",
                          f[i].flag, ml_model_name(m), (unsigned long long)T, f[i].flag);
        return ML_EXIT_BAD_INPUT;
    }
    return 0;
}

/* DeepSpeed's bucket sizes where nothing uses them: without ZeRO the
 * plan's gradients are DDP's, and only --emit deepspeed writes them. */
static int bucket_flags(const ml_cli_opts *o, const ml_training *t)
{
    const char *f = o->reduce_bucket ? "--reduce-bucket-size"
                    : o->allgather_bucket ? "--allgather-bucket-size"
                                          : NULL;
    if (!f || t->zero || t->dist_optimizer || (o->emit && !strcmp(o->emit, "deepspeed")))
        return 0;
    ml_cli_errorf("%s: sizes DeepSpeed's ZeRO buckets (--zero 1 to 3), and the plan has no "
                  "ZeRO: its gradients are DDP's; drop %s, or give --zero (or --emit "
                  "deepspeed, which writes it)",
                  f, f);
    return ML_EXIT_BAD_INPUT;
}

int ml_cli_unused_flags(const ml_cli_opts *o, const ml_model *m, const ml_training *t)
{
    int rc = fixed_seq_flags(o, m, t);
    return rc ? rc : bucket_flags(o, t);
}
