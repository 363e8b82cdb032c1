/* The transformer chains' last blocks (chain_transformer.c builds the
 * rest), from their op graphs (graph/kit_head.c): a decoder's final norm
 * and LM head (Gemma 2: its soft-capped logits) or sequence classifier,
 * BERT's masked-LM head, the encoder classifiers, then the loss, or the
 * fused linear cross-entropy (logits: fused), with what eager autograd
 * keeps for each (docs/inventory.md, "Heads and losses"); what the graphs
 * do not hold (the tied table's gradient, the block rule's transients)
 * stays here. */
#include <stdlib.h>
#include <string.h>

#include "graph/kit_head.h"
#include "ledger/chain_kit.h"

bool ml__ck_autocast_ops(const ml_model *m)
{
    const bool layer = m->residual.prenorm && !m->residual.parallel && !m->residual.post_norms &&
                       !m->moe.experts && !m->attn.kv_lora && !m->attn.fused_proj &&
                       !(m->attn.softcap > 0) && m->attn.kernel == ML_ATTN_EAGER;
    const bool layernorm = m->norms.kind == ML_NORM_LAYERNORM && m->embed.position != ML_POS_ROPE;
    /* ViT's layer (the live-bytes oracle's xc-vit), a decoder's of GPT-2's
     * or Llama's layout */
    if (m->embed.image_size)
        return m->type == ML_MODEL_ENCODER && layer && layernorm;
    return m->type == ML_MODEL_DECODER && layer &&
           (layernorm || m->norms.kind == ML_NORM_RMSNORM);
}

/* Whether the blocks record their backward nodes (docs/ledger.md,
 * "Backward, node by node"): fp32 eager blocks, and under autocast the
 * layouts ml__ck_autocast_ops names; not the experts' dispatch under
 * expert parallelism (its backward is the block rule's). */
bool ml__ck_node_level(const ml_chain *ch, const ml_model *m)
{
    const bool prec = ch->prec.autocast ? ml__ck_autocast_ops(m)
                                        : ch->prec.a == 4 && ch->prec.w == 4;
    return prec && !ch->ep_dispatch && !ml__ck_fused_attention(ch->prec.a, m) &&
           !m->attn.kv_lora && !m->moe.router_sigmoid && !m->moe.sort;
}

/* A tied V x D weight over the vocabulary (an LM head's, the fused
 * cross-entropy's: the word embeddings; an untied one is the graph's
 * parameter): its gradient is first created here (with accumulation this
 * block's contribution is a transient). */
static void tied_vocab_grad(ml_chain *ch, ml_cblock *b, const ml_ck_dims *d)
{
    b->grad_bytes = ml_mul(ch, ml_mul(ch, d->V, d->D), ch->prec.grad);
    b->grad_accum_bytes = b->grad_bytes;
    b->tied_grad = b->grad_bytes;
}

/* Liger Kernel's chunk (liger_kernel/ops/fused_linear_cross_entropy.py,
 * fused_linear_cross_entropy_forward): next_power_of_2(ceil(BT / ceil(V /
 * D))) rows, or training.logits_chunk; at most the BT rows there are. */
static uint64_t fused_chunk_rows(const ml_ck_dims *d, uint64_t asked)
{
    uint64_t rows = asked;
    if (!rows) {
        uint64_t inc = (d->V + d->D - 1) / d->D;
        uint64_t want = (d->BT + inc - 1) / inc;
        rows = 1;
        while (rows < want && rows < (1ull << 62))
            rows <<= 1;
    }
    return rows < d->BT ? rows : d->BT;
}

/* logits: fused, the loss block of a decoder (docs/ledger.md, "The loop's
 * references"): Liger's fused linear cross-entropy on the final norm's
 * output x (BT x D, nb bytes). Its forward allocates the LM head weight's
 * gradient (zeros_like(weight)) and x's (zeros_like(x)), an fp32 loss per
 * row and the bool target mask, then per chunk of rows: logits = x_chunk @
 * W^T, the cross-entropy's gradient written over them in place, x's
 * gradient rows = logits @ W (a temporary, copied in), W's gradient +=
 * logits^T x_chunk (addmm into it). The loop rebinds `logits_chunk` only
 * when the next chunk's product exists, so two chunks' logits are alive at
 * that moment. The backward returns the two gradients (grad_output is 1):
 * nothing new. FLOPs: the three products, all in forward. */
static void fused_loss(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                       uint64_t chunk_asked, unsigned nb, ml_ck_graph *G)
{
    const unsigned a = ch->prec.a;
    uint64_t rows = fused_chunk_rows(d, chunk_asked);
    uint64_t second = d->BT > rows ? (d->BT - rows < rows ? d->BT - rows : rows) : 0;
    uint64_t two = ml_mul(ch, ml_add(ch, rows, second), ml_mul(ch, d->V, a));
    uint64_t one = ml_mul(ch, rows, ml_mul(ch, ml_add(ch, d->V, d->D), a));
    uint64_t rowwise = ml_mul(ch, d->BT, 5); /* loss_1d (fp32) and the target mask */
    b->in_bytes = ml_mul(ch, ml_mul(ch, d->BT, d->D), nb);
    b->ws_fwd = ml_add(ch, two > one ? two : one, rowwise);
    b->unit_fwd = ml_mul(ch, ml_mul(ch, rows, d->V), a);
    uint64_t ws = b->ws_fwd;
    b->grads_in_fwd = true;
    /* the op graph's inventory, parameter, FLOPs and node
     * (graph/kit_head.c); tied, the embeddings' gradient is first created
     * here */
    if (m->embed.tied)
        tied_vocab_grad(ch, b, d);
    ml__ck_graph_emit(ch, b, G, 0);
    /* ml__ck_end's estimates are for ops that save: this one's forward
     * transient is the chunks', its backward allocates nothing, and under
     * no_grad its two gradients are transients too */
    b->ws_fwd = ws;
    b->ws_bwd = 0;
    b->unit = b->unit_fwd;
    b->ws_nograd = ml_add(ch, ws, ml_add(ch, b->in_bytes, b->grad_bytes));
    b->ws_formula = true;
}

/* The head's op graph into *G (docs/graph.md): a decoder's LM head
 * (fused: its norm alone) or sequence classifier, an encoder's classifier
 * or masked-LM head; *G NULL when the graph declines it. */
static ml_status graph_head(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, bool fused,
                            ml_ck_graph **G)
{
    *G = NULL;
    /* (the fused head's norm records its nodes in every dtype: on a 2-byte
     * stream the graph's RMSNorm nodes have the fp32 upcast's gradients
     * and the casts' nodes, which PyTorch measures, tests/torch/fusednorm.py,
     * where the builders counted the stream's dtype throughout) */
    const bool dec = m->type == ML_MODEL_DECODER;
    /* (a classifier's fused loss is refused: chain.c) */
    if (fused && (m->head.classes || !dec))
        return ML_OK;
    if (!(*G = malloc(sizeof **G)))
        return ML_NOMEM;
    const bool taken = !dec              ? (m->head.mlm ? ml__ck_graph_mlm_head(ch, m, d, *G)
                                                        : ml__ck_graph_encoder_head(ch, m, d, *G))
                       : m->head.classes ? ml__ck_graph_cls_head(ch, m, d, *G)
                                         : ml__ck_graph_head(ch, m, d, fused, *G);
    if (!taken) {
        free(*G);
        *G = NULL;
    }
    return ML_OK;
}

/* The fused head (its norm, G) and the fused linear cross-entropy;
 * ML_RANGE when the graph declines the loss. */
static ml_status fused_head_and_loss(ml_chain *ch, ml_cblock *b, const ml_model *m,
                                     const ml_ck_dims *d, const ml_training *t, ml_ck_graph *G)
{
    /* node lists: the norm's, and the fused op's hand-over */
    ch->record_nodes = !ch->prec.autocast;
    const unsigned nb = ch->prec.w;
    /* the op graph's norm (docs/graph.md): its output has the stream's
     * dtype */
    ml__ck_graph_emit(ch, b, G, ml_mul(ch, ml_mul(ch, d->BT, d->D), nb));
    b = ml__ck_begin(ch, "loss", -1);
    if (!b)
        return ML_NOMEM;
    b->fwd_phase = ML_PHASE_LOSS;
    /* the loss's graph (the head's storage reused) */
    if (!ml__ck_graph_fused_loss(ch, m, d, G))
        return ML_RANGE;
    fused_loss(ch, b, m, d, t->logits_chunk, nb, G);
    ch->record_nodes = false;
    return ML_OK;
}

/* The head block, then the loss: cross-entropy = log_softmax (saves its
 * output; autocast runs it in fp32) + nll_loss (saves the int64 targets);
 * with logits: fused, the final norm and the fused linear cross-entropy.
 * ML_RANGE when the op graph declines the head or the loss. */
ml_status ml__ck_head_and_loss(ml_chain *ch, const ml_model *m, const ml_ck_dims *d,
                               const ml_training *t)
{
    const unsigned a = ch->prec.a;
    ml_cblock *b = ml__ck_begin(ch, "head", -1);
    if (!b)
        return ML_NOMEM;
    b->in_bytes = ml_mul(ch, ml_mul(ch, d->BTs, d->D), ch->prec.w);
    ml_ck_graph *G;
    ml_status st = graph_head(ch, m, d, t->logits == ML_LOGITS_FUSED, &G);
    if (st != ML_OK)
        return st;
    if (!G)
        return ML_RANGE; /* not modelled: no other rule plans it */
    if (t->logits == ML_LOGITS_FUSED) {
        st = fused_head_and_loss(ch, b, m, d, t, G);
        free(G);
        return st;
    }
    /* an LM head replays its backward node by node (the mm's two
     * gradients beside the logits', then the norm's nodes; soft-capped,
     * its three logits-sized gradients in turn first); a classifier keeps
     * the block rule */
    ch->record_nodes = !m->head.classes && ml__ck_node_level(ch, m);
    /* tied, the embeddings' gradient is first created here (a classifier
     * has no output embedding) */
    if (m->embed.tied && !m->head.classes)
        tied_vocab_grad(ch, b, d);
    const uint64_t rows = m->head.classes ? d->B : d->BT;
    const uint64_t out_classes = m->head.classes ? m->head.classes : d->V;
    ml__ck_graph_emit(ch, b, G, ml_mul(ch, ml_mul(ch, rows, out_classes), a));
    free(G);
    ch->record_nodes = false;
    return ml__ck_ce_loss(ch, m, d, rows, out_classes);
}

/* The loss's inventory from the op graph (graph/kit_head.c: the
 * log-softmax output, the targets, total_weight); *taken false: the graph
 * declines it. */
static ml_status graph_loss(ml_chain *ch, ml_cblock *b, uint64_t rows, uint64_t classes,
                            bool megatron, bool *taken)
{
    ml_ck_graph *G = malloc(sizeof *G);
    if (!G)
        return ML_NOMEM;
    *taken = megatron ? ml__ck_graph_megatron_loss(ch, rows, classes, G)
                      : ml__ck_graph_loss(ch, rows, classes, G);
    if (*taken)
        ml__ck_graph_emit(ch, b, G, 0);
    free(G);
    return ML_OK;
}

/* Megatron-LM's vocab-parallel cross-entropy (engine megatron, or tensor
 * parallelism above 1): the saved softmax, target mask and masked targets
 * from its graph; the block rule's transients from its source
 * (megatron/core/tensor_parallel/cross_entropy.py): in forward the
 * row-sized temporaries beside the softmax (the maxima, the arange index,
 * the predicted logits and the sums of exponentials: 4 + 8 + 4 + 4 bytes a
 * row); in backward the gradient is the saved softmax itself, changed in
 * place (its row-sized temporaries, 12 bytes a row, freed before what
 * follows: not counted), then, for 2-byte logits, cast back to their dtype
 * for the head (the .float()'s ToCopyBackward0: a new tensor of the
 * logits' size beside the softmax, the block's backward peak, as
 * tests/torch/megatron_ce_twin.py measures it); fp32 logits are the
 * softmax and get their gradient in place (tests/torch/tp_twins.py).
 * GPTModel computes the loss inside its forward and returns it, not the
 * logits (engine megatron's default loop is training.logits released);
 * with eager layers training.logits decides, and the loop's targets are
 * its batch (targets_held). */
static ml_status megatron_loss(ml_chain *ch, ml_cblock *b, uint64_t rows, uint64_t classes,
                               bool targets_held)
{
    bool taken = false;
    ml_status st = graph_loss(ch, b, rows, classes, true, &taken);
    if (st || !taken)
        return st ? st : ML_RANGE;
    /* eager PyTorch's loop holds the int64 targets in its batch */
    if (targets_held)
        ch->batch_targets = ml_add(ch, ch->batch_targets, ml_mul(ch, rows, 8));
    const uint64_t logits = ml_mul(ch, rows, classes);
    /* fp32 logits are the softmax (the graph saved the block's input):
     * the gradient is made in them and handed on, nothing to cast back */
    const bool fp32 = b->in_saved;
    b->ws_fwd = ml_mul(ch, rows, 20);
    b->ws_bwd = fp32 ? 0 : ml_mul(ch, logits, ch->prec.a);
    b->ws_nograd = ml_add(ch, b->ws_fwd, b->saved_bytes);
    b->ws_formula = true;
    b->unit_fwd = ml_mul(ch, rows, 8);
    b->unit = b->ws_bwd;
    b->in_bytes = ml_mul(ch, logits, ch->prec.a);
    b->in_held = true; /* the loop's logits mode decides (released, by default) */
    return ML_OK;
}

ml_status ml__ck_seq_loss_graph(ml_chain *ch, ml_cblock *b, bool ce, uint64_t rows, uint64_t n,
                                unsigned in_bytes, bool *taken)
{
    if (ce)
        return graph_loss(ch, b, rows, n / rows, false, taken);
    ml_ck_graph *G = malloc(sizeof *G);
    if (!G)
        return ML_NOMEM;
    *taken = ml__ck_graph_mse_loss(ch, n, in_bytes, G);
    if (*taken)
        ml__ck_graph_emit(ch, b, G, 0);
    free(G);
    return ML_OK;
}

ml_status ml__ck_ce_loss(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, uint64_t rows,
                         uint64_t out_classes)
{
    const unsigned w = ch->prec.w, a = ch->prec.a;
    ml_status st;
    uint64_t logits = ml_mul(ch, rows, out_classes);
    ml_cblock *b = ml__ck_begin(ch, "loss", -1);
    if (!b)
        return ML_NOMEM;
    b->fwd_phase = ML_PHASE_LOSS;
    if (m->head.vocab_parallel_ce)
        return megatron_loss(ch, b, rows, out_classes, m->head.targets_held);
    unsigned lsb = ch->prec.autocast ? 4 : w;
    bool graph = false;
    if ((st = graph_loss(ch, b, rows, out_classes, false, &graph)) != ML_OK)
        return st;
    if (!graph)
        return ML_RANGE; /* not modelled: no other rule plans it */
    /* the block rule's figures, the builders' own (the graph's ml__ck_end
     * estimates are for ops that save their inputs: set over here) */
    b->ws_fwd = 0;
    if (ch->prec.autocast) {
        b->ws_fwd = ml_mul(ch, logits, 4); /* fp32 cast of the logits */
        /* the LM head's input, the final norm's output in the stream's
         * dtype: transformers' forward holds it (hidden_states) until the
         * loss is computed and it returns (modeling_llama.py,
         * LlamaForCausalLM.forward; GPT2LMHeadModel's likewise), and under
         * autocast the head saves only its bf16 copy, so it is the loss's
         * to hold (in fp32 and pure bf16 the head saves it itself);
         * ViTForImageClassification's sequence_output the same (its
         * classifier saves the bf16 copy of the class token's row) */
        if ((m->type == ML_MODEL_DECODER && !m->head.classes) ||
            (m->type == ML_MODEL_ENCODER && m->embed.image_size))
            b->ws_fwd = ml_add(ch, b->ws_fwd, ml_mul(ch, ml_mul(ch, d->BT, d->D), w));
    }
    if (m->type == ML_MODEL_DECODER && m->head.classes)
        /* the sequence-classification head's locals, alive until its
         * forward returns after the loss: the (B, T, classes) logits and,
         * with a pad token, the int32 pad mask and positions (seq_cls_head) */
        b->ws_fwd = ml_add(ch, b->ws_fwd,
                           ml_add(ch, ml_mul(ch, ml_mul(ch, d->BT, m->head.classes), a),
                                  m->head.cls_no_pad
                                      ? 0
                                      : ml_add(ch, ml_mul(ch, d->BT, 4), ml_mul(ch, d->T, 4))));
    /* backward: grad of log-probs and grad of logits coexist */
    b->ws_bwd = ml_mul(ch, ml_mul(ch, logits, lsb), 2);
    /* under no_grad (evaluation) what the loss saves is transient, beside
     * the fp32 cast */
    b->ws_nograd = ml_add(ch, b->ws_fwd, b->saved_bytes);
    b->ws_formula = true;
    b->unit_fwd = b->ws_fwd;               /* the fp32 cast */
    b->unit = ml_mul(ch, logits, lsb);     /* two tensors of the logits' size */
    b->in_bytes = ml_mul(ch, logits, a);
    /* under autocast the gradient handed to the head is the .float()
     * cast's (ToCopyBackward0), made after log_softmax's backward has
     * released nll_loss's gradient and the saved log-probabilities */
    b->hand_last = ch->prec.autocast && lsb != a;
    b->in_held = true; /* the model returns the logits to the caller */
    return ML_OK;
}

/* The loss graphs (graph/kit_head.c): the fused cross-entropy's, sized as
 * a layer's; the others by their literals. */
bool ml__ck_graph_fused_loss(ml_chain *ch, const ml_model *m, const ml_ck_dims *d,
                             ml_ck_graph *G)
{
    ml__kit_fused_ce(&G->g, m->embed.tied);
    if (!ml__ck_graph_sized(ch, m, d, G))
        return false;
    G->programs = false; /* the chunks' transients: the chain's */
    return true;
}

/* A loss graph's sizes: its literals only; the block rule's figures. */
static bool loss_sized(ml_chain *ch, ml_ck_graph *G)
{
    if (!ml__graph_valid(&G->g))
        return false;
    memset(&G->z, 0, sizeof G->z);
    memcpy(&G->z.dim[MLG_L0], G->g.lit, G->g.nlit * sizeof G->g.lit[0]);
    ml__ck_graph_dtype_bytes(ch, G);
    G->programs = false; /* the block rule */
    return true;
}

bool ml__ck_graph_loss(ml_chain *ch, uint64_t rows, uint64_t classes, ml_ck_graph *G)
{
    ml__kit_ce_loss(&G->g, rows, classes);
    return loss_sized(ch, G);
}

bool ml__ck_graph_megatron_loss(ml_chain *ch, uint64_t rows, uint64_t classes, ml_ck_graph *G)
{
    ml__kit_megatron_ce(&G->g, rows, classes, ch->prec.a == 4);
    return loss_sized(ch, G);
}

bool ml__ck_graph_mse_loss(ml_chain *ch, uint64_t n, unsigned in_bytes, ml_ck_graph *G)
{
    /* the input's class by its bytes, as the sequential kit maps them */
    const uint8_t cls = in_bytes == ch->prec.w ? MLG_STREAM
                        : in_bytes == 1        ? MLG_BOOL
                        : in_bytes == 2        ? MLG_HALF
                        : in_bytes == 8        ? MLG_INT64
                                               : MLG_FP32;
    ml__kit_mse_loss(&G->g, n, cls, ch->prec.autocast && in_bytes != 4);
    return loss_sized(ch, G);
}
