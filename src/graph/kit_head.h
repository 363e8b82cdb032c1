/* The transformer chains' last blocks as op graphs (kit_head.c): the
 * cross-entropy loss over the logits and a decoder's sequence-
 * classification head; a decoder's LM head is compose.c's
 * (ml__kit_lm_head). Their own sizes are the graph's literals (g->lit,
 * MLG_L0 on), which whoever sizes it copies into ml_graph_sizes.dim.
 * docs/graph.md, "Embeddings, heads and losses". */
#ifndef ML_GRAPH_KIT_HEAD_H
#define ML_GRAPH_KIT_HEAD_H

#include "graph/families.h"

/* The loss block: F.cross_entropy on `rows` rows of `classes` logits,
 * log_softmax (its output saved; autocast runs it in fp32, the stream's
 * dtype there) then nll_loss (the int64 targets, part of the batch the
 * loop holds, and its fp32 total_weight saved). */
void ml__kit_ce_loss(ml_graph *g, uint64_t rows, uint64_t classes);

/* Megatron-LM's vocab-parallel cross-entropy on `rows` rows of a rank's
 * `classes` logits (megatron/core/tensor_parallel/cross_entropy.py,
 * _VocabParallelCrossEntropy): the logits cast to fp32 (.float(), a copy;
 * fp32_logits: the logits themselves), the maximum subtracted, exp taken
 * and the sums divided in place, so the copy (or the logits) becomes the
 * softmax it saves, with the target mask (bool) and the masked targets
 * (int64, a clone of the targets); the loss per token (fp32). */
void ml__kit_megatron_ce(ml_graph *g, uint64_t rows, uint64_t classes, bool fp32_logits);

/* A sequential model's mean-squared-error loss block on n elements:
 * mse_loss saves its input (the block's, of class in_dtype) and the
 * target (the weights' dtype, part of the batch the loop holds); cast:
 * autocast runs it in fp32 and it saves an fp32 copy of a half input
 * instead. */
void ml__kit_mse_loss(ml_graph *g, uint64_t n, uint8_t in_dtype, bool cast);

/* A decoder's sequence-classification head (transformers'
 * GenericForSequenceClassification, as LlamaForSequenceClassification and
 * the others use it): L's final norm, `score` (D -> classes, no bias) on
 * every token, then each sequence's last token (pad: the last non-pad
 * one, found through pad_token_id). */
void ml__kit_seq_cls_head(ml_graph *g, const mlg_layer *L, uint64_t classes, bool pad);
/* m's: the norm of its layer family's (ml__family_layer), a decoder with
 * classes and no soft-capped logits (whose node list the builders record
 * and then drop: chain_head.c). */
bool ml__family_seq_cls_head(const ml_model *m, const mlg_config *c, mlg_layer *L);

/* An encoder's classifier head: (ViT's final norm, prenorm,) the first
 * token, (BertPooler's dense and tanh, pooler,) (dropout,) the classifier
 * Linear (D -> classes, with bias). */
void ml__kit_encoder_classifier(ml_graph *g, const mlg_layer *L, uint64_t classes, bool prenorm,
                                bool pooler, bool dropout);
/* m's: an encoder with classes and no masked-LM head whose layer family
 * the kit has (ml__family_layer: BERT's, ViT's). */
bool ml__family_encoder_classifier(const ml_model *m, const mlg_config *c, mlg_layer *L);

/* BertForMaskedLM's head (BertLMPredictionHead): dense, the activation,
 * LayerNorm, then the decoder over the vocabulary (tied: the word
 * embeddings) with its own bias. Its dimension L0 is D + V, which whoever
 * sizes it sets (the FLOPs of both products). */
void ml__kit_mlm_head(ml_graph *g, const mlg_layer *L, bool tied);
/* m's: an encoder with the masked-LM head whose layer family the kit has
 * (BERT's). */
bool ml__family_mlm_head(const ml_model *m, const mlg_config *c, mlg_layer *L);

/* Liger's fused linear cross-entropy (logits: fused) on the final norm's
 * output: the int64 targets (the batch's) saved, the (V, D) weight (tied:
 * the word embeddings); its forward computes both gradients, its backward
 * node hands them over. Its chunks' transients are the chain's
 * (ledger/chain_head.c). */
void ml__kit_fused_ce(ml_graph *g, bool tied);

#endif
