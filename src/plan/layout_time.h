/* The layout search's transfers (layout_time.c). Internal to the library. */
#ifndef ML_PLAN_LAYOUT_TIME_H
#define ML_PLAN_LAYOUT_TIME_H

#include "memledger/plan.h"

/* The transfers' time of a row planned as l: tensor and context
 * parallelism inside a node, expert parallelism while its group fits one,
 * the pipeline's p2p and data parallelism's collectives over the network
 * once their groups leave the node (tp innermost, then cp, pp, dp), each
 * call's latency beside its bytes (*lat: that part); -1 when a link's
 * bandwidth is unknown. */
double ml__layout_comm_time(const ml_config *cfg, const ml_layout_request *req,
                            const ml_ledger *l, const ml_layout_row *row, double *lat);

#endif
