/* The work of each block's ops, for the step-time model (docs/time.md).
 *
 * As a chain is built, each block made from an op graph lists what its ops
 * do to the device (ml_work_item, chain.h): the kernels each launches, its
 * FLOPs, the bytes it reads and writes and, for a matrix product, its
 * shape; then the same for each op's backward node, in the order autograd
 * runs them. Nothing here depends on the device: the time model
 * (steptime.c) prices the items at a device's rates. Every figure is a
 * sum of tensor sizes or a dimension, affine in the micro-batch, so a
 * prepared planner derives them with the rest of the chain
 * (chain_affine.c). A block not made from an op graph has no items; the
 * model times it by its FLOPs alone and says so. */
#ifndef ML_WORK_H
#define ML_WORK_H

#include "graph/graph.h"
#include "ledger/chain.h"

/* Block b's items from its graph g at sizes z with bytes tb (in eval mode
 * dropout is the identity and no backward nodes are listed). */
void ml__work_graph(ml_chain *ch, ml_cblock *b, const ml_graph *g, const ml_graph_sizes *z,
                    const uint64_t *tb);

#endif
