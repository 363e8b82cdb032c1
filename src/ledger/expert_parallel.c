/* Expert parallelism (docs/parallel.md, "Expert parallelism"): a mixture
 * of experts' routed experts split over ep ranks, each holding E / ep of
 * them. A rank routes its own tokens over all E experts, sends each (token,
 * expert) pair to the rank that holds the expert (an all-to-all), runs its
 * own experts on the rows it receives and sends their outputs back (a
 * second all-to-all), as Megatron-core's MoEAlltoAllTokenDispatcher does
 * (megatron/core/transformer/moe/token_dispatcher.py). The ranks are taken
 * from the data-parallel ones (times cp): the layers outside the experts
 * are replicated over them as before, and the devices are unchanged. */
#include <stdio.h>
#include <string.h>

#include "ledger/chain.h"
#include "ledger/chain_kit.h"
#include "ledger/replay.h" /* ml__ceil_div */
#include "util/error.h"

static uint64_t gcd(uint64_t a, uint64_t b)
{
    while (b) {
        const uint64_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

static uint64_t dp_of(const ml_training *t)
{
    return t->data_parallel ? t->data_parallel : 1;
}

bool ml__ep_dispatched(const ml_model *m, const ml_training *t)
{
    return m->moe.experts &&
           (ml_training_ep(t) > 1 || ml_training_etp(t) > 1 || t->tensor_parallel > 1);
}

/* The refusals of the experts' grouping when their data-parallel ranks are
 * not the rest's (ep x etp != tp): what is not planned beside it. */
static ml_status regroup_refused(const ml_training *t, const char *what, ml_error *err)
{
    if (t->dist_optimizer || t->offload != ML_OFFLOAD_NONE ||
        ml_training_shard(t) < dp_of(t))
        return ml__errorf(err, ML_RANGE,
                          "%s with %s: its buffers beside the experts' two shard groups (the "
                          "ranks that hold the same experts, dp x cp for the rest) are not "
                          "modelled yet; plan it with ZeRO 0 to 3, without the distributed "
                          "optimizer, offload or HSDP",
                          what,
                          t->dist_optimizer ? "the distributed optimizer"
                          : t->offload     ? "offload"
                                           : "HSDP shard groups");
    if (t->zero >= 1 && (t->optimizer == ML_OPT_ADAFACTOR || t->optimizer == ML_OPT_ADAM_8BIT ||
                         t->optimizer_impl == ML_IMPL_FOR_LOOP))
        return ml__errorf(err, ML_RANGE,
                          "%s with ZeRO and %s: its %s not the same for every parameter "
                          "element, so the experts' shard of them is not planned; use adam, "
                          "adamw, sgd or lion with the foreach or fused step, or ZeRO 0",
                          what,
                          t->optimizer_impl == ML_IMPL_FOR_LOOP ? "the for-loop step"
                                                                : ml_optimizer_name(t->optimizer),
                          t->optimizer_impl == ML_IMPL_FOR_LOOP
                              ? "step's temporaries (the largest tensor's) are"
                              : "states are");
    return ML_OK;
}

/* training.expert_capacity and expert_pad: Megatron's dispatch's. */
static ml_status capacity_refused(const ml_model *m, const ml_training *t, ml_error *err)
{
    if (!(t->expert_capacity > 0) && !t->expert_pad)
        return ML_OK;
    const char *key = t->expert_capacity > 0 ? "training.expert_capacity"
                                             : "training.expert_pad";
    if (!m->moe.experts)
        return ml__errorf(err, ML_RANGE,
                          "%s: a mixture of experts' setting; %s has no experts "
                          "(model.experts): remove it",
                          key, m->name);
    if (!(t->expert_capacity > 0))
        return ml__errorf(err, ML_RANGE,
                          "training.expert_pad: pads each expert's share to its capacity, "
                          "as Megatron's --moe-pad-expert-input-to-capacity (which needs "
                          "its capacity factor): give training.expert_capacity too");
    if (!ml__ep_dispatched(m, t))
        return ml__errorf(err, ML_RANGE,
                          "%s: the capacity is Megatron-core's dispatch's (it drops and "
                          "pads the pairs it sends); Hugging Face's loop, planned without "
                          "parallel.ep, etp or tp, drops no token: plan the dispatch "
                          "(--ep, --etp or --tp) or remove it",
                          key);
    return ML_OK;
}

ml_status ml__ep_refused(const ml_model *m, const ml_training *t, ml_error *err)
{
    const uint64_t ep = ml_training_ep(t), etp = ml_training_etp(t);
    const uint64_t tp = t->tensor_parallel > 1 ? t->tensor_parallel : 1;
    const unsigned long long e = (unsigned long long)ep;
    if (!m->moe.experts && (ep > 1 || t->expert_tensor_parallel > 1))
        return ml__errorf(err, ML_RANGE,
                          "parallel.%s: %llu with %s: it splits a mixture of experts' routed "
                          "experts, and this model has none; give 1",
                          ep > 1 ? "ep" : "etp",
                          ep > 1 ? e : (unsigned long long)t->expert_tensor_parallel, m->name);
    ml_status st = capacity_refused(m, t, err);
    if (st)
        return st;
    if (!ml__ep_dispatched(m, t))
        return ML_OK;
    char what[64];
    snprintf(what, sizeof what, ep > 1 ? "parallel.ep: %llu" : "parallel.etp: %llu",
             ep > 1 ? e : (unsigned long long)etp);
    if (m->moe.experts % ep)
        return ml__errorf(err, ML_RANGE,
                          "parallel.ep: %llu does not divide %s's %llu routed experts "
                          "(model.experts): each rank holds an equal share; use an ep that "
                          "divides %llu",
                          e, m->name, (unsigned long long)m->moe.experts,
                          (unsigned long long)m->moe.experts);
    const uint64_t fe = m->moe.expert_ffn ? m->moe.expert_ffn : m->mlp.ffn;
    if (fe % etp)
        return ml__errorf(err, ML_RANGE,
                          "parallel.etp: %llu does not divide %s's expert width (%llu, "
                          "model.expert_ffn): each rank holds an equal share of every "
                          "expert; use an etp that divides %llu (it defaults to tp)",
                          (unsigned long long)etp, m->name, (unsigned long long)fe,
                          (unsigned long long)fe);
    const uint64_t ranks = tp * dp_of(t) * ml_training_cp(t);
    if (ranks % (ep * etp))
        return ml__errorf(err, ML_RANGE,
                          "%s: ep %llu x etp %llu does not divide the %llu ranks of a stage "
                          "(tp x cp x dp), which Megatron-core splits into expert-tensor x "
                          "expert x the experts' data-parallel ranks; make "
                          "training.data_parallel a multiple of %llu, or ep or etp smaller "
                          "(etp defaults to tp)",
                          ep > 1 ? "parallel.ep" : "parallel.etp", e, (unsigned long long)etp,
                          (unsigned long long)ranks,
                          (unsigned long long)(ep * etp / gcd(ep * etp, ranks / dp_of(t))));
    if (ep * etp < tp)
        return ml__errorf(err, ML_RANGE,
                          "%s with parallel.tp %llu: experts replicated over tensor-parallel "
                          "ranks (ep x etp below tp) reduce their gradients over more ranks "
                          "than the rest, which is not planned yet; give an etp of tp (the "
                          "default) or ep x etp of at least tp",
                          what, (unsigned long long)tp);
    if (ep * etp != tp && (st = regroup_refused(t, what, err)))
        return st;
    if (t->engine == ML_ENGINE_MEGATRON)
        return ml__errorf(err, ML_RANGE,
                          "%s under training.engine megatron: Megatron-core's MoE layer is not "
                          "modelled; plan the eager layers (engine eager)",
                          what);
    return ML_OK;
}

/* A layer's rows under the dispatch: P the (token, expert) pairs the rank
 * sends (of its sequence shard under sequence parallelism; an expert
 * capacity drops or pads them), R the rows its experts take, RA the rows
 * the all-to-all brings it (R / etp, rounded up), row the bytes of one (D
 * elements of the stream's dtype). */
typedef struct {
    double P, R, RA, row;
} layer_rows;

static layer_rows rows_of(const ml_chain *ch)
{
    const uint64_t etp = ch->etp ? ch->etp : 1;
    return (layer_rows){(double)ch->ep_pairs, (double)ch->ep_rows,
                        (double)ml__ceil_div(ch->ep_rows, etp),
                        (double)ch->c_width * ch->prec.w};
}

/* The experts' counts a layer's forward all-gathers: each rank's count of
 * its pairs for every expert (E int64), over the ep x etp ranks
 * (MoEAlltoAllTokenDispatcher.preprocess, gather_from_sequence_parallel_region
 * over tp_ep_group): a ring sends the other ranks' E x 8 bytes. */
static double counts_bytes(const ml_chain *ch, const ml_training *t)
{
    /* padded to the capacity, the splits are known: preprocess returns
     * before the all-gather */
    if (t->expert_pad && t->expert_capacity > 0)
        return 0;
    const double n = (double)(ch->ep * (ch->etp ? ch->etp : 1));
    return (n - 1) * (double)ch->moe_experts * 8;
}

double ml__ep_communication(const ml_chain *ch, const ml_training *t, const int *seg,
                            double *calls)
{
    *calls = 0;
    if (ch->ep <= 1 || !ch->ep_rows)
        return 0;
    /* per MoE layer and micro-batch: forward, the experts' counts
     * (counts_bytes), the pairs' tokens and routing weights sent to the
     * ranks of their experts (dispatch: all but the S its own experts
     * take), the outputs of the rows received from the others sent back
     * (combine: RA - S); backward, the returned rows' gradients to the
     * experts' ranks (P - S) and the received rows' and weights' back to
     * their sources (RA - S; the splits kept); a recomputed layer's
     * forward again. Balanced, S is P / ep: (ep - 1) / ep of each. A row
     * is D elements of the stream's dtype, a weight 4 bytes (fp32) */
    const layer_rows r = rows_of(ch);
    const double S = (double)ch->ep_self;
    const double out = r.P > S ? r.P - S : 0, in = r.RA > S ? r.RA - S : 0;
    const double fwd = out * (r.row + 4) + in * r.row + counts_bytes(ch, t);
    const double bwd = out * r.row + in * (r.row + 4);
    double L, R;
    ml__chain_layers(ch, seg, true, &L, &R);
    const double A = (double)(t->grad_accum ? t->grad_accum : 1);
    /* the calls: the counts' all-gather (none padded), the tokens' and the
     * weights' all-to-alls and the combine's in forward, three in
     * backward, the forward's again when recomputed */
    const double c = counts_bytes(ch, t) > 0 ? 1 : 0;
    *calls = A * ((6 + c) * L + (3 + c) * R);
    return A * ((fwd + bwd) * L + fwd * R);
}

double ml__etp_communication(const ml_chain *ch, const ml_training *t, const int *seg,
                             double *calls)
{
    *calls = 0;
    if (ch->etp <= 1 || !ch->ep_rows)
        return 0;
    /* per MoE layer and micro-batch, ring collectives over the etp ranks,
     * each sending (etp - 1) / etp of the R rows (docs/parallel.md):
     * forward, the all-gathers of the rows and of their routing weights
     * (fp32) and the reduce-scatter of the outputs, in fp32
     * (combine_preprocess casts them to the weights' dtype); backward,
     * the reduce-scatter's all-gather of the gradients (fp32) and the
     * all-gathers' reduce-scatters (the rows' and the weights'); a
     * recomputed layer's forward again. With one expert-parallel rank the
     * experts' counts' all-gather is theirs (with more, the all-to-alls') */
    const double f = (double)(ch->etp - 1) / (double)ch->etp;
    const layer_rows r = rows_of(ch);
    const double rs = r.R * (double)ch->c_width * 4;
    const double counts = ch->ep > 1 ? 0 : counts_bytes(ch, t);
    const double fwd = f * (r.R * (r.row + 4) + rs) + counts, bwd = f * (rs + r.R * (r.row + 4));
    double L, R;
    ml__chain_layers(ch, seg, true, &L, &R);
    const double A = (double)(t->grad_accum ? t->grad_accum : 1);
    const double c = counts > 0 ? 1 : 0;
    *calls = A * ((6 + c) * L + (3 + c) * R);
    return A * ((fwd + bwd) * L + fwd * R);
}

/* Whether the experts' data-parallel ranks are not the rest's. */
static bool regrouped(const ml_chain *ch)
{
    return ch->ep_dispatch && ch->ep * ch->etp != ch->ep_tp;
}

uint64_t ml__ep_ranks(const ml_chain *ch, uint64_t N)
{
    if (!regrouped(ch))
        return N;
    const uint64_t div = ch->ep * ch->etp, n = N * ch->ep_tp;
    return n % div ? 0 : n / div;
}

uint64_t ml__ep_expert_params(const ml_chain *ch)
{
    if (!regrouped(ch))
        return 0;
    double L, R;
    ml__chain_layers(ch, NULL, true, &L, &R);
    return (uint64_t)L * ch->ep_layer_params;
}

double ml__ep_saving(const ml_chain *ch, const ml_training *t, double times, double per)
{
    if (!regrouped(ch) || !ch->ep_layer_params)
        return 0;
    const double N = (double)ml__shard_group(t), Ne = (double)ml__ep_ranks(ch, (uint64_t)N);
    const double fe = Ne > 1 ? (Ne - 1) / Ne : 0;
    return times * ((N - 1) / N - fe) * (double)ml__ep_expert_params(ch) * per;
}

/* A shard over N ranks of `all` bytes of which `experts` are the routed
 * experts': theirs over the ranks that hold them (ml__ep_ranks), the rest
 * over N (all / N rounded up when the experts are not regrouped). */
static uint64_t split(const ml_chain *ch, uint64_t all, uint64_t experts, uint64_t N)
{
    const uint64_t Ne = ml__ep_ranks(ch, N);
    if (!regrouped(ch) || !experts || experts > all || !Ne)
        return ml__ceil_div(all, N);
    return ml__ceil_div(all - experts, N) + ml__ceil_div(experts, Ne);
}

/* Block b's routed experts' bytes, `per` a parameter: a layer's when the
 * experts are regrouped, else 0. */
static uint64_t block_experts(const ml_chain *ch, const ml_cblock *b, unsigned per)
{
    if (!regrouped(ch) || b->ckpt_index < 0 || !b->moe)
        return 0;
    return ch->ep_layer_params * per;
}

uint64_t ml__ep_shard(const ml_chain *ch, const ml_training *t, uint64_t all, uint64_t experts)
{
    return split(ch, all, experts, ml__shard_group(t));
}

/* The experts' dispatch (graph/kit_mixtral_ep.c; its backward is the block
 * rule's, docs/parallel.md): the bytes of the rows (R x D, RA x D) and of
 * the pairs sent (MLG_PS x D), from the graph's tensors. In forward,
 * beside the saved tensors, MoELayer holds the send buffer and the
 * received rows to its end (in a group of one rank they are the same; with
 * one local expert its ops save the rows) while the experts' weighted
 * outputs are made and concatenated: P + RA + 2 R rows at the cat (one
 * local expert: no cat, P + R); under no_grad the experts' rows too, not
 * saved there; with expert-tensor ranks the reduce-scatter holds the
 * sorted-back outputs beside its input (fp32: a cast of them when the rows
 * are not) and its output, and the combine's all-to-all its input and
 * output. In backward, beside the block rule's transient, the split's
 * backward holds the experts' input gradients and their concatenation
 * beside the incoming rows' gradient: 3 R rows (one local expert: no
 * split, 2 R) (megatron/core/transformer/moe/experts.py, SequentialMLP;
 * token_dispatcher.py). */
void ml__ep_dispatch(ml_chain *ch, ml_cblock *b, const ml_ck_graph *G)
{
    const ml_graph_sizes *z = &G->z;
    if (!ch->ep_dispatch || !z->dim[MLG_R])
        return;
    /* the rows and pairs in the dtype of the norm's output they are taken
     * from: the stream's (fp32 under autocast, else the compute dtype) */
    const uint64_t w = z->bytes[MLG_STREAM];
    const uint64_t row = ml_mul(ch, z->dim[MLG_D], w);
    const uint64_t rows = ml_mul(ch, z->dim[MLG_R], row);
    /* the pairs the rank sends (MLG_PS: of its sequence shard's tokens) */
    const uint64_t pairs = ml_mul(ch, z->dim[MLG_PS], row);
    /* one local expert: no sort, no concatenation; its rows (the
     * all-to-all's, or gathered) saved as they come */
    const bool one = ch->ep > 1 && ch->moe_experts == ch->ep;
    const uint64_t ra = ml_mul(ch, z->dim[MLG_RA], row);
    /* held to the layer's end beside the saved tensors: the send buffer
     * and the received rows (the send buffer's in a group of one; saved
     * with one local expert and no expert-tensor ranks) */
    const uint64_t held =
        ml_add(ch, pairs, ch->ep > 1 && !(one && ch->etp <= 1) ? ra : 0);
    /* at the concatenation: the experts' outputs and theirs (one: its own) */
    uint64_t fwd = ml_add(ch, held, ml_mul(ch, one ? 1 : 2, rows));
    if (ch->etp > 1) {
        const uint64_t ra32 = ml_mul(ch, ml_mul(ch, z->dim[MLG_RA], z->dim[MLG_D]), 4);
        const uint64_t rs = w == 4 ? ml_add(ch, rows, ra32)
                                   : ml_add(ch, ml_add(ch, rows, ml_mul(ch, rows, 4) / w), ra32);
        if (ml_add(ch, held, rs) > fwd)
            fwd = ml_add(ch, held, rs);
    }
    if (ch->ep > 1) { /* the combine's all-to-all: its input and the returned rows */
        const uint64_t in = ch->etp > 1 ? ra : rows;
        if (ml_add(ch, ml_add(ch, held, pairs), in) > fwd)
            fwd = ml_add(ch, ml_add(ch, held, pairs), in);
    }
    if (fwd > b->ws_fwd)
        b->ws_fwd = fwd;
    const uint64_t nograd = ml_add(ch, fwd, rows);
    if (nograd > b->ws_nograd)
        b->ws_nograd = nograd;
    /* the split's backward: the experts' input gradients, their
     * concatenation and the incoming rows' gradient (one: no split) */
    b->ws_bwd = ml_add(ch, b->ws_bwd, ml_mul(ch, one ? 2 : 3, rows));
}

uint64_t ml__ep_grad_shard(const ml_chain *ch, const ml_cblock *b, uint64_t N)
{
    return split(ch, b->grad_bytes, block_experts(ch, b, ch->prec.grad), N);
}

double ml__ep_ring(const ml_chain *ch, const ml_cblock *b, uint64_t N, double all,
                   unsigned per)
{
    const double f = N > 1 ? (double)(N - 1) / (double)N : 0;
    const double experts = (double)block_experts(ch, b, per);
    if (!(experts > 0) || experts > all)
        return f * all;
    const double Ne = (double)ml__ep_ranks(ch, N), fe = Ne > 1 ? (Ne - 1) / Ne : 0;
    return f * (all - experts) + fe * experts;
}
