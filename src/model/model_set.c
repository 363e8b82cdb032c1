/* Settings of a loaded model that the command line and the bindings may
 * change (model.h), the attention implementation, and a limit its
 * reference code sets. */
#include <string.h>

#include "memledger/model.h"
#include "model/model_internal.h"
#include "util/error.h"

ml_status ml_model_set_attention(ml_model *m, const char *name, ml_error *err)
{
    static const struct {
        const char *name;
        ml_attention a;
    } names[] = {{"eager", ML_ATTN_EAGER},
                 {"sdpa", ML_ATTN_SDPA},
                 {"flash", ML_ATTN_FLASH},
                 {"flash_attention_2", ML_ATTN_FLASH},
                 {"flash_attention_3", ML_ATTN_FLASH}};
    if (m->type == ML_MODEL_SEQUENTIAL)
        return ml__errorf(err, ML_SCHEMA,
                          "model.attention: %s is a sequential model, whose attention layers "
                          "are planned eager (docs/inventory.md); the choice is a "
                          "transformer's",
                          m->name);
    for (size_t i = 0; name && i < sizeof names / sizeof *names; i++)
        if (!strcmp(name, names[i].name)) {
            if (m->type == ML_MODEL_ENCDEC && names[i].a != ML_ATTN_EAGER)
                return ml__errorf(err, ML_SCHEMA,
                                  "model.attention: '%s' is not modelled for T5 (%s): its "
                                  "position bias is added to the scores, and transformers runs "
                                  "T5's attention eagerly; use eager",
                                  name, m->name);
            m->attn.kernel = names[i].a;
            m->attn.kernel_assumed = NULL;
            return ML_OK;
        }
    return ml__errorf(err, ML_SCHEMA,
                      "model.attention: '%s' is unknown; use eager, sdpa or flash "
                      "(flash_attention_2 and flash_attention_3 name flash)",
                      name ? name : "(null)");
}

const char *ml_model_attention(const ml_model *m)
{
    if (m->type == ML_MODEL_SEQUENTIAL)
        return NULL;
    return m->attn.kernel == ML_ATTN_SDPA    ? "sdpa"
           : m->attn.kernel == ML_ATTN_FLASH ? "flash"
                                             : "eager";
}

const char *ml_model_attention_assumed(const ml_model *m)
{
    return m->type == ML_MODEL_SEQUENTIAL ? NULL : m->attn.kernel_assumed;
}

uint64_t ml_model_target_len(const ml_model *m, const ml_training *t)
{
    if (m->type != ML_MODEL_ENCDEC)
        return 0;
    return t->target_len ? t->target_len : t->seq_len;
}

uint64_t ml_model_experts(const ml_model *m)
{
    return m->moe.experts;
}

uint64_t ml_model_fixed_seq_len(const ml_model *m)
{
    if (m->type == ML_MODEL_SEQUENTIAL)
        return 1;
    if (!m->embed.image_size || !m->embed.patch_size || m->vision.layers)
        return 0;
    const uint64_t g = m->embed.image_size / m->embed.patch_size;
    return g * g + 1;
}

ml_status ml_model_check_seq(const ml_model *m, const ml_training *t, ml_error *err)
{
    const uint64_t T = ml_model_fixed_seq_len(m);
    const bool eval = t->seq_len == T; /* else the training length is the one */
    const uint64_t v = eval ? t->eval_seq_len : t->seq_len;
    if (!T || !v || v == T)
        return ML_OK;
    if (T == 1)
        return ml__errorf(err, ML_RANGE,
                          "training.%s: %llu for %s, a sequential model, whose input shape is "
                          "model.input (no sequence length changes it): remove it",
                          eval ? "eval_seq_len" : "seq_len", (unsigned long long)v, m->name);
    return ml__errorf(err, ML_RANGE,
                      "training.%s: %llu for %s, a vision encoder, whose sequence is its "
                      "image's patches and the class token (%llu tokens, set by the image and "
                      "patch sizes): remove it",
                      eval ? "eval_seq_len" : "seq_len", (unsigned long long)v, m->name,
                      (unsigned long long)T);
}

ml_status ml__model_check_buckets(const ml_model *m, const ml_training *t, const char *given,
                                  ml_error *err)
{
    static const char *const keys[] = {"training.reduce_bucket_size",
                                       "training.allgather_bucket_size"};
    unsigned line, col;
    const char *key = given;
    for (size_t k = 0; !key && k < 2; k++)
        if (ml_model_key_position(m, keys[k], &line, &col))
            key = keys[k];
    if (t->zero || !key)
        return ML_OK;
    return ml__errorf(err, ML_USAGE,
                      "%s: sizes DeepSpeed's ZeRO buckets (training.zero 1 to 3), and the plan "
                      "has no ZeRO: its gradients are DDP's (Megatron's distributed optimizer "
                      "buckets its own); drop it, or set training.zero (--emit deepspeed writes "
                      "it)",
                      key);
}

uint64_t ml_model_max_micro_batch(const ml_model *m)
{
    return m->type == ML_MODEL_DECODER && m->head.classes && m->head.cls_no_pad ? 1 : 0;
}
