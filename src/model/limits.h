/* The whole-number limits of a configuration, one table for every reader:
 * the YAML loader (with the key's position), the CLI's flags (with the
 * flag's name, through ml_config_range) and ml_config_problem (with the
 * key's name). Internal to the library. */
#ifndef MEMLEDGER_MODEL_LIMITS_H
#define MEMLEDGER_MODEL_LIMITS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memledger/model.h"

typedef struct ml_uint_limit {
    const char *key;     /* "training.micro_batch": section and YAML key */
    size_t offset;       /* of the field in ml_config */
    size_t width;        /* sizeof the field */
    uint64_t lo, hi;     /* accepted, inclusive */
    bool zero_unset;     /* 0 means "not given" and passes */
    const char *problem; /* what ml_config_problem says when outside */
} ml_uint_limit;

/* The table and its length. */
const ml_uint_limit *ml__uint_limits(size_t *count);
/* The row of `key`, or NULL. */
const ml_uint_limit *ml__uint_limit_of(const char *key);
/* The field's value in c. */
uint64_t ml__uint_limit_get(const ml_uint_limit *l, const ml_config *c);

#endif
