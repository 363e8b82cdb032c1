/* A ledger's events reduced to what colocate reads: each event's time and
 * the device bytes after it (internal; docs/colocate.md, "Memory"). */
#ifndef ML_LEDGER_LEVELS_H
#define ML_LEDGER_LEVELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memledger/ledger.h"

typedef struct ml_level {
    double t_s;     /* as the event's t_s */
    uint64_t total; /* the sum of its live[] */
} ml_level;

/* Replaces l's events with their levels, 16 bytes each instead of an
 * ml_event's: ml_ledger_events then returns none, ml__ledger_levels them.
 * Returns false, the events kept, when out of memory. */
bool ml__ledger_keep_levels(ml_ledger *l);

/* The levels that replaced l's events (*n of them), or NULL while l holds
 * its events (or has none). */
const ml_level *ml__ledger_levels(const ml_ledger *l, size_t *n);

#endif
