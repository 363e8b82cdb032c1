/* The allocator simulations a search or a comparison has run
 * (passes.c): a simulation replays the same events whenever the config
 * agrees but for the checkpoint policy, which the chain reads only as
 * selective or not (ml__chain_key), and the plan's segments agree, so
 * ml__eval_reserved runs it once and answers again from here
 * (docs/allocator.md, "Speed"). Owned by the caller, which keeps it no
 * longer than its own search (configs' pointers, a start state, are
 * compared by address): zeroed before the first use, freed with
 * ml__reserved_memo_free. */
#ifndef ML_RESERVED_MEMO_H
#define ML_RESERVED_MEMO_H

#include <stddef.h>

typedef struct ml_reserved_seen ml_reserved_seen;
typedef struct {
    ml_reserved_seen *e;
    size_t n, cap;
} ml_reserved_memo;
void ml__reserved_memo_free(ml_reserved_memo *memo);

#endif
