/* Context parallelism (docs/parallel.md, "Context parallelism"): a rank
 * holds T / cp of every sequence, and its attention runs PyTorch's ring
 * attention (torch.distributed.tensor.experimental.context_parallel, as
 * torchtitan applies it): the local queries attend to every rank's keys
 * and values, passed around the ring. The chain of a rank is the chain at
 * T / cp tokens (ml__ck_dims_of), its fused attention's FLOPs over the
 * whole sequence's keys (MLG_TKV). */
#include "graph/graph.h"
#include "ledger/chain.h"
#include "ledger/chain_kit.h"
#include "util/error.h"

ml_status ml__cp_refused(const ml_model *m, const ml_training *t, ml_error *err)
{
    const uint64_t cp = t->context_parallel;
    if (cp <= 1)
        return ML_OK;
    if (m->type != ML_MODEL_DECODER || m->vision.layers || m->embed.image_size)
        return ml__errorf(err, ML_RANGE,
                          "parallel.cp: %llu with %s: context parallelism is planned for "
                          "decoder language models (type: decoder)",
                          (unsigned long long)cp, m->name);
    if (m->head.classes)
        return ml__errorf(err, ML_RANGE,
                          "parallel.cp: %llu with %s: a sequence-classification head reads "
                          "each sequence's last token, on one rank of the ring; not modelled",
                          (unsigned long long)cp, m->name);
    if (t->engine == ML_ENGINE_MEGATRON)
        return ml__errorf(err, ML_RANGE,
                          "parallel.cp: %llu under training.engine megatron: Megatron-core's "
                          "context parallelism runs Transformer Engine's attention, which is "
                          "not modelled; plan PyTorch's ring attention (engine eager)",
                          (unsigned long long)cp);
    if (!ml__ck_fused_attention(ml__prec_of(t->precision).a, m))
        return ml__errorf(err, ML_RANGE,
                          "parallel.cp: %llu with %s's attention (%s%s): ring attention runs a "
                          "fused scaled_dot_product_attention kernel (flash or memory-efficient); "
                          "use --attention flash%s",
                          (unsigned long long)cp, m->name,
                          m->attn.kernel == ML_ATTN_EAGER ? "eager" : "sdpa",
                          m->attn.kernel == ML_ATTN_EAGER ? "" : ", its math kernel here",
                          m->residual.shared_norm ? "" : ", or sdpa at a 2-byte precision");
    /* the causal mask's load balancing cuts each sequence into 2 cp chunks,
     * a rank taking one from each end */
    const uint64_t T = t->seq_len, Te = t->eval_seq_len;
    if (T % (2 * cp) || (t->eval_batch && Te && Te % (2 * cp)))
        return ml__errorf(err, ML_RANGE,
                          "parallel.cp: %llu does not split %s of %llu tokens into 2 x cp = "
                          "%llu equal chunks (ring attention's load balancing of the causal "
                          "mask); use a length that is a multiple of %llu",
                          (unsigned long long)cp,
                          T % (2 * cp) ? "training.seq_len" : "training.eval_seq_len",
                          (unsigned long long)(T % (2 * cp) ? T : Te),
                          (unsigned long long)(2 * cp), (unsigned long long)(2 * cp));
    return ML_OK;
}

uint64_t ml__cp_ring_backward(ml_chain *ch, const ml_graph_sizes *z)
{
    if (ch->cp <= 1)
        return 0;
    const uint64_t B = z->dim[MLG_B], T = z->dim[MLG_T], dh = z->dim[MLG_DH];
    const uint64_t q = ml_mul(ch, ml_mul(ch, B, z->dim[MLG_H]), ml_mul(ch, T, dh));
    const uint64_t kv = ml_mul(ch, ml_mul(ch, B, z->dim[MLG_HKV]), ml_mul(ch, T, dh));
    /* the keys and values all-gathered again (kv_rotater), 2 a bytes an
     * element of each rank's; grad_query in fp32 and _partial_update's
     * cat of it; [dK, dV] in fp32 (accum_dtype), about four such pairs
     * alive as dkv_rotater passes them on */
    const uint64_t gathered = ml_mul(ch, ml_mul(ch, 2 * ch->prec.a, kv), ch->cp);
    return ml_add(ch, gathered, ml_add(ch, ml_mul(ch, 8, q), ml_mul(ch, 32, kv)));
}

double ml__cp_communication(const ml_chain *ch, const ml_training *t, const int *seg,
                            double *halves, double *sends)
{
    *halves = *sends = 0;
    if (ch->cp <= 1)
        return 0;
    /* per layer: the forward's all-gather of [K, V] (each rank sends its
     * 2 a e bytes to the cp - 1 others' gathers, a ring's (cp - 1) of
     * them), the backward's again, and cp permutes of the fp32 [dK, dV],
     * 8 e bytes each; a recomputed layer gathers once more */
    const double cp = (double)ch->cp, e = (double)ch->cp_kv, a = ch->prec.a;
    const double gather = (cp - 1) * 2 * a * e;
    double layers, recomputed;
    ml__chain_layers(ch, seg, false, &layers, &recomputed);
    const double per_micro = layers * (2 * gather + cp * 8 * e) + recomputed * gather;
    const double A = (double)(t->grad_accum ? t->grad_accum : 1);
    *halves = A * (2 * layers + recomputed);
    *sends = A * cp * layers;
    return per_micro * A;
}
