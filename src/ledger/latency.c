/* NCCL's latency model for the ring algorithm with its Simple protocol, the
 * one it picks for the large messages of training (src/graph/tuning.cc at
 * commit b6475625, ncclTopoTuneModel and ncclTopoGetAlgoTime): a base of
 * 8.4 us per call, and per ring step 3.4 us over NVLink inside a node or
 * 14.0 us over the network between nodes (hwLat, Ring, Simple). An
 * all-reduce takes 2 (n - 1) steps, 2 x nodes of them between nodes when
 * it leaves one; an all-gather or reduce-scatter n - 1, nodes - 1 between
 * nodes. A multi-node all-reduce's latency is then 1.4 times that (the
 * ring's "plateau effect" on Ampere and later). A send is one step on its
 * link beside the base: NCCL's point-to-point path is not in that table,
 * and this is memledger's reading (docs/search.md); so is an all-to-all,
 * its sends to every peer launched as one group (ncclGroupStart .. End),
 * concurrently: one step on the slowest link it crosses. */
#include "ledger/latency.h"

#define BASE_US 8.4
#define NVLINK_US 3.4
#define NET_US 14.0

double ml__coll_latency_s(ml_coll kind, uint64_t ranks, uint64_t nodes)
{
    if (ranks <= 1)
        return 0;
    if (nodes < 1)
        nodes = 1;
    const double n = (double)ranks, N = (double)nodes;
    double us;
    if (kind == ML_COLL_SEND || kind == ML_COLL_ALL_TO_ALL) {
        us = BASE_US + (nodes > 1 ? NET_US : NVLINK_US);
    } else if (kind == ML_COLL_ALL_REDUCE) {
        const double steps = 2 * (n - 1), inter = nodes > 1 ? 2 * N : 0;
        us = BASE_US + (steps - inter) * NVLINK_US + inter * NET_US;
        if (nodes > 1)
            us *= 1.4;
    } else {
        const double steps = n - 1, inter = N - 1;
        us = BASE_US + (steps - inter) * NVLINK_US + inter * NET_US;
    }
    return us * 1e-6;
}
