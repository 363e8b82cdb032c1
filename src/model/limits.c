/* The whole-number limits of a configuration (limits.h): one row per key,
 * the message derived from the same numbers. */
#include "model/limits.h"

#include <string.h>

#include "memledger/model.h"
#include "model/model_internal.h"

/* the numbers appear once: the message is made from the same tokens */
#define LIMIT(section, field, yaml, lo, hi, zero_unset)                                      \
    {#section "." #yaml, offsetof(ml_config, section.field),                               \
     sizeof(((ml_config *)0)->section.field), lo, hi, zero_unset,                          \
     #section "." #yaml ": must be between " #lo " and " #hi}

static const ml_uint_limit table[] = {
    LIMIT(training, micro_batch, micro_batch, 1, 16777216, false),
    LIMIT(training, seq_len, seq_len, 1, 268435456, false),
    LIMIT(training, grad_accum, grad_accum, 1, 1048576, false),
    LIMIT(training, data_parallel, data_parallel, 1, 1048576, false),
    LIMIT(training, zero, zero, 0, 3, false),
    LIMIT(training, reduce_bucket, reduce_bucket_size, 1, 1099511627776, false),
    LIMIT(training, allgather_bucket, allgather_bucket_size, 1, 1099511627776, false),
    LIMIT(training, eval_batch, eval_batch, 1, 16777216, true),
    LIMIT(training, eval_seq_len, eval_seq_len, 1, 268435456, true),
    LIMIT(training, logits_chunk, logits_chunk, 1, 268435456, true),
    LIMIT(training, target_len, target_len, 1, 268435456, true),
    {"parallel.tp", offsetof(ml_config, training.tensor_parallel),
     sizeof(((ml_config *)0)->training.tensor_parallel), 1, 65536, true,
     "parallel.tp: must be between 1 and 65536"},
    {"parallel.pp", offsetof(ml_config, training.pipeline_parallel),
     sizeof(((ml_config *)0)->training.pipeline_parallel), 1, 256, true,
     "parallel.pp: must be between 1 and 256"},
    {"parallel.cp", offsetof(ml_config, training.context_parallel),
     sizeof(((ml_config *)0)->training.context_parallel), 1, 65536, true,
     "parallel.cp: must be between 1 and 65536"},
    {"parallel.ep", offsetof(ml_config, training.expert_parallel),
     sizeof(((ml_config *)0)->training.expert_parallel), 1, 65536, true,
     "parallel.ep: must be between 1 and 65536"},
    {"parallel.etp", offsetof(ml_config, training.expert_tensor_parallel),
     sizeof(((ml_config *)0)->training.expert_tensor_parallel), 1, 65536, true,
     "parallel.etp: must be between 1 and 65536"},
    {"parallel.vpp", offsetof(ml_config, training.virtual_stages),
     sizeof(((ml_config *)0)->training.virtual_stages), 1, 1024, true,
     "parallel.vpp: must be between 1 and 1024"},
};

_Static_assert(ML_MAX_BATCH == 16777216 && ML_MAX_TOKENS == 268435456,
               "the limits table spells ML_MAX_BATCH and ML_MAX_TOKENS out");

const ml_uint_limit *ml__uint_limits(size_t *count)
{
    *count = sizeof table / sizeof table[0];
    return table;
}

const ml_uint_limit *ml__uint_limit_of(const char *key)
{
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(table[i].key, key))
            return &table[i];
    return NULL;
}

uint64_t ml__uint_limit_get(const ml_uint_limit *l, const ml_config *c)
{
    const unsigned char *p = (const unsigned char *)c + l->offset;
    if (l->width == sizeof(uint64_t)) {
        uint64_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    unsigned v;
    memcpy(&v, p, sizeof v);
    return v;
}

bool ml_config_range(const char *key, uint64_t *lo, uint64_t *hi)
{
    const ml_uint_limit *l = ml__uint_limit_of(key);
    if (!l)
        return false;
    *lo = l->lo;
    *hi = l->hi;
    return true;
}
