/* A row of the layout search timed (docs/search.md): each collective's
 * bytes at the bandwidth of the link its group crosses and each call's
 * latency (NCCL's: ledger/latency.c), not overlapped with the compute. */
#include "ledger/latency.h"
#include "ledger/replay.h" /* ml__dp_hidden_s */
#include "plan/layout_time.h"

/* Bytes over a link of gbps GB/s; -1 when the link is unknown. */
static double over(double bytes, double gbps)
{
    if (bytes <= 0)
        return 0;
    return gbps > 0 ? bytes / (gbps * 1e9) : -1;
}

/* A mixture of experts' expert-tensor ranks (tp's unless the row has its
 * own). */
static uint64_t etp_of(const ml_layout_row *row)
{
    return row->etp ? row->etp : row->tp;
}

/* The devices a block of n consecutive expert ranks spans: Megatron's
 * expert order (etp, then ep, then the experts' dp) over a stage's tp x cp
 * x dp ranks, which the search places tp innermost, then cp, then pp, then
 * dp: within tp x cp they are consecutive devices, beyond they stride over
 * the pipeline's stages. */
static uint64_t expert_span(const ml_layout_row *row, uint64_t n)
{
    const uint64_t tc = row->tp * (row->cp > 1 ? row->cp : 1);
    return n <= tc ? n : tc * row->pp * ((n + tc - 1) / tc);
}

/* Whether an expert-parallel group stays inside a node of G: its ranks
 * are data-parallel ones, which the search places after the tensor-,
 * context-parallel and pipeline ranks, so with the expert-tensor ranks
 * tp's the group spans tp x cp x pp x ep devices; else it is the block of
 * its ep x etp expert ranks (expert_span). */
static bool ep_inside(const ml_layout_row *row, uint64_t G)
{
    const uint64_t ep = row->ep > 1 ? row->ep : 1;
    if (etp_of(row) == row->tp)
        return row->tp * (row->cp > 1 ? row->cp : 1) * row->pp * ep <= G;
    return expert_span(row, ep * etp_of(row)) <= G;
}

/* The same for an expert-tensor group: its etp consecutive expert ranks. */
static bool etp_inside(const ml_layout_row *row, uint64_t G)
{
    return expert_span(row, etp_of(row)) <= G;
}

/* The calls' latency (docs/search.md, "Latency"): tensor and context
 * parallelism's inside a node; the pipeline's sends over the network once
 * its stages leave the node; data parallelism's group over the nodes its
 * ranks are on (strided by tp x cp x pp). */
static double latency(const ml_ledger *l, const ml_layout_row *row, uint64_t G)
{
    const ml_summary *s = ml_ledger_summary(l);
    const uint64_t cp = row->cp > 1 ? row->cp : 1, tc = row->tp * cp, D = row->dp * cp;
    const uint64_t nodes = tc * row->pp >= G ? row->dp : (row->dp * tc * row->pp + G - 1) / G;
    double sends = 0;
    for (size_t i = 0; i < ml_ledger_rank_count(l); i++)
        if (ml_ledger_rank(l, i)->p2p_sends > sends)
            sends = ml_ledger_rank(l, i)->p2p_sends;
    return s->tp_allreduces * ml__coll_latency_s(ML_COLL_ALL_REDUCE, row->tp, 1) +
           s->tp_halves * ml__coll_latency_s(ML_COLL_HALF, row->tp, 1) +
           s->cp_halves * ml__coll_latency_s(ML_COLL_HALF, cp, 1) +
           s->cp_sends * ml__coll_latency_s(ML_COLL_SEND, cp, 1) +
           sends * ml__coll_latency_s(ML_COLL_SEND, row->pp, tc * row->pp > G ? 2 : 1) +
           s->dp_allreduces * ml__coll_latency_s(ML_COLL_ALL_REDUCE, D, nodes) +
           s->dp_halves * ml__coll_latency_s(ML_COLL_HALF, D, nodes) +
           s->ep_calls * ml__coll_latency_s(ML_COLL_ALL_TO_ALL, row->ep, ep_inside(row, G) ? 1 : 2) +
           s->etp_calls * ml__coll_latency_s(ML_COLL_HALF, etp_of(row), etp_inside(row, G) ? 1 : 2);
}

/* The transfers' time: tensor parallelism inside a node, the pipeline's
 * p2p and data parallelism's collectives over the network once their
 * groups leave the node (tp innermost, then pp, then dp), each call's
 * latency beside its bytes (*lat: that part). */
double ml__layout_comm_time(const ml_config *cfg, const ml_layout_request *req,
                            const ml_ledger *l, const ml_layout_row *row, double *lat)
{
    const ml_summary *s = ml_ledger_summary(l);
    const double intra = ml_device_interconnect(&cfg->device);
    const double preset_net = ml_device_network(&cfg->device);
    const double net = req->network_gbps > 0 ? req->network_gbps
                       : preset_net > 0      ? preset_net
                                             : intra;
    const uint64_t G = req->gpus_per_node ? req->gpus_per_node : 8;
    double p2p = 0;
    for (size_t i = 0; i < ml_ledger_rank_count(l); i++)
        if (ml_ledger_rank(l, i)->p2p_bytes > p2p)
            p2p = ml_ledger_rank(l, i)->p2p_bytes;
    const uint64_t tc = row->tp * (row->cp > 1 ? row->cp : 1); /* inside a node */
    /* (dp 1: the gradients reduce over the cp ranks, inside the node) */
    const double dpbw = row->dp > 1 && tc * row->pp * row->dp > G ? net : intra;
    /* (the expert-tensor ranks inside a node unless a pinned etp takes
     * them past tp x cp and a node) */
    double parts[6] = {over(s->tp_comm_bytes, intra), over(p2p, tc * row->pp > G ? net : intra),
                       over(s->comm_bytes, dpbw), over(s->cp_comm_bytes, intra),
                       over(s->ep_comm_bytes, ep_inside(row, G) ? intra : net),
                       over(s->etp_comm_bytes, etp_inside(row, G) ? intra : net)};
    /* overlap_grad_reduce: what the last backward covers */
    if (parts[2] > 0) {
        const ml_config c = ml_layout_config(cfg, row);
        parts[2] -= ml__dp_hidden_s(s, &c.training, dpbw * 1e9);
    }
    double t = 0;
    *lat = 0;
    for (int i = 0; i < 6; i++) {
        if (parts[i] < 0)
            return -1;
        t += parts[i];
    }
    *lat = latency(l, row, G);
    return t + *lat;
}
