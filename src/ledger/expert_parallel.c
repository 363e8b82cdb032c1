/* Expert parallelism (docs/parallel.md, "Expert parallelism"): a mixture
 * of experts' routed experts split over ep ranks, each holding E / ep of
 * them. A rank routes its own tokens over all E experts, sends each (token,
 * expert) pair to the rank that holds the expert (an all-to-all), runs its
 * own experts on the rows it receives and sends their outputs back (a
 * second all-to-all), as Megatron-core's MoEAlltoAllTokenDispatcher does
 * (megatron/core/transformer/moe/token_dispatcher.py). The ranks are taken
 * from the data-parallel ones (times cp): the layers outside the experts
 * are replicated over them as before, and the devices are unchanged. */
#include <string.h>

#include "ledger/chain.h"
#include "ledger/chain_kit.h"
#include "ledger/replay.h" /* ml__ceil_div */
#include "util/error.h"

ml_status ml__ep_refused(const ml_model *m, const ml_training *t, ml_error *err)
{
    const uint64_t ep = ml_training_ep(t);
    if (ep == 1)
        return ML_OK;
    const unsigned long long e = (unsigned long long)ep;
    if (!m->moe.experts)
        return ml__errorf(err, ML_RANGE,
                          "parallel.ep: %llu with %s: expert parallelism splits a mixture of "
                          "experts' routed experts, and this model has none; give 1",
                          e, m->name);
    if (m->moe.sort || m->moe.router_sigmoid || m->attn.kv_lora || m->moe.dense_layers)
        return ml__errorf(err, ML_RANGE,
                          "parallel.ep: %llu with %s: DeepSeek's experts (their routers and "
                          "sorted dispatch) are not split over ranks yet; expert parallelism "
                          "is planned for Mixtral's and Qwen2-MoE's layers",
                          e, m->name);
    if (m->moe.experts % ep)
        return ml__errorf(err, ML_RANGE,
                          "parallel.ep: %llu does not divide %s's %llu routed experts "
                          "(model.experts): each rank holds an equal share; use an ep that "
                          "divides %llu",
                          e, m->name, (unsigned long long)m->moe.experts,
                          (unsigned long long)m->moe.experts);
    const uint64_t dpc = (t->data_parallel ? t->data_parallel : 1) * ml_training_cp(t);
    if (dpc % ep)
        return ml__errorf(err, ML_RANGE,
                          "parallel.ep: %llu does not divide the %llu data-parallel ranks "
                          "(dp x cp): the expert-parallel ranks are taken from them, as "
                          "Megatron-core takes them; give --data-parallel a multiple of %llu",
                          e, (unsigned long long)dpc, e);
    if (t->dist_optimizer || t->offload != ML_OFFLOAD_NONE ||
        ml_training_shard(t) < (t->data_parallel ? t->data_parallel : 1))
        return ml__errorf(err, ML_RANGE,
                          "parallel.ep: %llu with %s: its buffers beside the experts' two "
                          "shard groups (the dp x cp / ep ranks that share an expert, dp x cp "
                          "for the rest) are not modelled yet; plan expert parallelism with "
                          "ZeRO 0 to 3, without the distributed optimizer, offload or HSDP",
                          e,
                          t->dist_optimizer ? "the distributed optimizer"
                          : t->offload     ? "offload"
                                           : "HSDP shard groups");
    if (t->zero >= 1 && (t->optimizer == ML_OPT_ADAFACTOR || t->optimizer == ML_OPT_ADAM_8BIT ||
                         t->optimizer_impl == ML_IMPL_FOR_LOOP))
        return ml__errorf(err, ML_RANGE,
                          "parallel.ep: %llu with ZeRO and %s: its %s not the same for every "
                          "parameter element, so the experts' shard of them is not planned; "
                          "use adam, adamw, sgd or lion with the foreach or fused step, or "
                          "ZeRO 0",
                          e,
                          t->optimizer_impl == ML_IMPL_FOR_LOOP ? "the for-loop step"
                                                                : ml_optimizer_name(t->optimizer),
                          t->optimizer_impl == ML_IMPL_FOR_LOOP
                              ? "step's temporaries (the largest tensor's) are"
                              : "states are");
    if (t->engine == ML_ENGINE_MEGATRON)
        return ml__errorf(err, ML_RANGE,
                          "parallel.ep: %llu under training.engine megatron: Megatron-core's "
                          "MoE layer is not modelled; plan the eager layers (engine eager)",
                          e);
    return ML_OK;
}

double ml__ep_communication(const ml_chain *ch, const ml_training *t, const int *seg,
                            double *calls)
{
    *calls = 0;
    if (ch->ep <= 1 || !ch->ep_rows)
        return 0;
    /* per MoE layer and micro-batch: forward, each expert's count of the
     * rank's pairs (E int64: the splits, MoEAlltoAllTokenDispatcher's
     * preprocess), the P pairs' tokens and routing weights sent
     * (dispatch), the R rows' outputs sent back (combine); backward, the
     * returned rows' gradients sent to the experts' ranks (P) and the
     * received rows' and weights' back to their sources (R; the splits
     * kept); a recomputed layer's forward again. A balanced router sends
     * (ep - 1) / ep of each to other ranks; a row is D elements of the
     * stream's dtype, a weight 4 bytes (fp32) */
    const double f = (double)(ch->ep - 1) / (double)ch->ep;
    const double P = (double)ch->B * (double)ch->T * (double)ch->moe_k;
    const double Rr = (double)ch->ep_rows, row = (double)ch->c_width * ch->prec.w;
    const double fwd = (double)ch->moe_experts * 8 + P * (row + 4) + Rr * row;
    const double bwd = P * row + Rr * (row + 4);
    double L, R;
    ml__chain_layers(ch, seg, &L, &R);
    const double A = (double)(t->grad_accum ? t->grad_accum : 1);
    /* the calls: the counts', the tokens' and the weights' all-to-alls
     * and the combine's in forward, three in backward, the forward's four
     * again when recomputed */
    *calls = A * (7 * L + 4 * R);
    return A * f * ((fwd + bwd) * L + fwd * R);
}

uint64_t ml__ep_expert_params(const ml_chain *ch)
{
    if (ch->ep <= 1)
        return 0;
    double L, R;
    ml__chain_layers(ch, NULL, &L, &R);
    return (uint64_t)L * ch->ep_layer_params;
}

double ml__ep_saving(const ml_chain *ch, const ml_training *t, double times, double per)
{
    if (ch->ep <= 1 || !ch->ep_layer_params)
        return 0;
    const double N = (double)ml__shard_group(t), Ne = N / (double)ch->ep;
    return times * ((N - 1) / N - (Ne - 1) / Ne) * (double)ml__ep_expert_params(ch) * per;
}

/* A shard over N ranks of `all` bytes of which `experts` are the routed
 * experts': theirs over the N / ep ranks that hold them, the rest over N
 * (all / N rounded up without ep or experts). */
static uint64_t split(uint64_t all, uint64_t experts, uint64_t N, uint64_t ep)
{
    if (ep <= 1 || !experts || experts > all || N < ep)
        return ml__ceil_div(all, N);
    return ml__ceil_div(all - experts, N) + ml__ceil_div(experts, N / ep);
}

/* Block b's routed experts' bytes, `per` a parameter: a layer's under
 * expert parallelism over N >= ep ranks, else 0. */
static uint64_t block_experts(const ml_chain *ch, const ml_cblock *b, uint64_t N, unsigned per)
{
    if (ch->ep <= 1 || b->ckpt_index < 0 || N < ch->ep)
        return 0;
    return ch->ep_layer_params * per;
}

uint64_t ml__ep_shard(const ml_chain *ch, const ml_training *t, uint64_t all, uint64_t experts)
{
    return split(all, experts, ml__shard_group(t), ch->ep);
}

/* Expert parallelism's dispatch (graph/kit_mixtral.c, experts_ep; its
 * backward is the block rule's, docs/parallel.md): the bytes of the
 * received rows (R x D) and of the permuted pairs (k B T x D), from the
 * graph's tensors. In forward, beside the saved tensors, MoELayer holds
 * the send buffer and the received rows to its end while the experts'
 * weighted outputs are made and concatenated: P + 3 R rows at the cat (and
 * under no_grad the sorted rows too, not saved there). In backward,
 * beside the block rule's transient, the split's backward holds the
 * experts' input gradients and their concatenation beside the incoming
 * rows' gradient: 3 R rows (megatron/core/transformer/moe/experts.py,
 * SequentialMLP; token_dispatcher.py). */
void ml__ep_dispatch(ml_chain *ch, ml_cblock *b, const ml_ck_graph *G)
{
    const ml_graph_sizes *z = &G->z;
    if (ch->ep <= 1 || !z->dim[MLG_R])
        return;
    /* the rows and pairs in the dtype of the norm's output they are taken
     * from: the stream's (fp32 under autocast, else the compute dtype) */
    const uint64_t row = ml_mul(ch, z->dim[MLG_D], z->bytes[MLG_STREAM]);
    const uint64_t rows = ml_mul(ch, z->dim[MLG_R], row);
    const uint64_t pairs =
        ml_mul(ch, ml_mul(ch, ml_mul(ch, z->dim[MLG_K], z->dim[MLG_B]), z->dim[MLG_T]), row);
    const uint64_t fwd = ml_add(ch, pairs, ml_mul(ch, 3, rows));
    if (fwd > b->ws_fwd)
        b->ws_fwd = fwd;
    const uint64_t nograd = ml_add(ch, fwd, rows);
    if (nograd > b->ws_nograd)
        b->ws_nograd = nograd;
    b->ws_bwd = ml_add(ch, b->ws_bwd, ml_mul(ch, 3, rows));
}

uint64_t ml__ep_grad_shard(const ml_chain *ch, const ml_cblock *b, uint64_t N)
{
    return split(b->grad_bytes, block_experts(ch, b, N, ch->prec.grad), N, ch->ep);
}

double ml__ep_ring(const ml_chain *ch, const ml_cblock *b, uint64_t N, double all,
                   unsigned per)
{
    const double f = N > 1 ? (double)(N - 1) / (double)N : 0;
    const double experts = (double)block_experts(ch, b, N, per);
    if (!(experts > 0) || experts > all)
        return f * all;
    const double Ne = (double)(N / ch->ep), fe = Ne > 1 ? (Ne - 1) / Ne : 0;
    return f * (all - experts) + fe * experts;
}
