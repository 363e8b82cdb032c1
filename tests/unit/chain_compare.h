/* A chain from the op graph checked whole (chain_whole: test_graph.c,
 * test_graph_heads.c, test_graph_rotln.c), and SAME: one field of a
 * chain's block (x) against the same block emitted from its graph alone
 * (y), the first difference failing the test with both values. */
#ifndef ML_TEST_CHAIN_COMPARE_H
#define ML_TEST_CHAIN_COMPARE_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "ledger/chain.h"
#include "model/model_internal.h"

#define SAME(f)                                                                          \
    do {                                                                                 \
        if (x->f != y->f)                                                                \
            fail_msg("%s: %s: %s %.17g (chain) != %.17g (graph alone)", what, who, #f,   \
                     (double)x->f, (double)y->f);                                        \
    } while (0)

/* Each block's saved entries add up to its saved_bytes, and its weight
 * copies (the entries flagged ML_SV_WCAST) to its cast_bytes: the allocator
 * simulation makes the saved tensors and the held copies from those
 * entries (reserved.c), else one tensor of their sum. A frozen tower's
 * blocks keep no saved bytes; a calibration profile's measured blocks
 * scale saved_bytes alone. */
static inline void casts_add_up(const ml_chain *b, const char *what)
{
    for (size_t i = 0; i < b->n; i++) {
        const ml_cblock *x = &b->blocks[i];
        uint64_t sum = 0, all = 0;
        for (size_t k = x->saved_first; k < x->saved_first + x->nsaved; k++) {
            all += b->saved[k].bytes;
            if (b->saved[k].flags & ML_SV_WCAST)
                sum += b->saved[k].bytes;
        }
        if (!x->frozen && sum != x->cast_bytes)
            fail_msg("%s: %s: weight copies %llu B, cast_bytes %llu", what, x->name,
                     (unsigned long long)sum, (unsigned long long)x->cast_bytes);
        if (!x->frozen && !x->measured && all != x->saved_bytes)
            fail_msg("%s: %s: saved entries %llu B, saved_bytes %llu", what, x->name,
                     (unsigned long long)all, (unsigned long long)x->saved_bytes);
    }
}

/* A transformer's chain from the graph, whole: its embedding, its layers
 * ("block.<i>", each with saved tensors, parameters and forward FLOPs), its
 * head and loss last. */
static inline void chain_whole(const ml_chain *b, const ml_model *m, const char *what)
{
    uint64_t layers = 0;
    for (size_t i = 0; i < b->n; i++) {
        const ml_cblock *x = &b->blocks[i];
        if (strncmp(x->name, "block.", 6))
            continue;
        layers++;
        if (!x->nsaved || !x->saved_bytes || !(x->flops_fwd > 0))
            fail_msg("%s: %s is not whole", what, x->name);
    }
    if (b->n < 3 || strcmp(b->blocks[0].name, "embedding") ||
        strcmp(b->blocks[b->n - 1].name, "loss") || layers < m->layers || !b->nparams)
        fail_msg("%s: %zu blocks, %llu layers: not the transformer's whole chain", what, b->n,
                 (unsigned long long)layers);
    casts_add_up(b, what);
}

#endif
