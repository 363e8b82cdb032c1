/* The transformer chains' first block as an op graph (kit_embed.c): the
 * token embeddings with learned or rotary positions (Gemma's sqrt(D)
 * scale; BERT's token types and LayerNorm) or ViT's patch embedding with
 * its class token and positions, then the embeddings' dropout. Its own
 * sizes (the position table's rows, the rotated width, the image's and
 * the patches') are the graph's literals (g->lit, MLG_L0 on), which whoever
 * sizes it copies into ml_graph_sizes.dim. docs/graph.md, "Embeddings,
 * heads and losses". */
#ifndef ML_GRAPH_KIT_EMBED_H
#define ML_GRAPH_KIT_EMBED_H

#include "graph/families.h"

typedef enum { MLG_ROTARY_NONE, MLG_ROTARY_COS_SIN, MLG_ROTARY_COMPLEX } mlg_rotary;

typedef struct {
    bool patches;   /* ViT: conv patchify, class token, positions */
    bool autocast;  /* torch.autocast: the patch conv reads cast copies */
    bool scale;     /* Gemma: embeds * sqrt(D) */
    bool learned;   /* learned absolute positions */
    bool types;     /* BERT's token types */
    bool layernorm; /* BERT: LayerNorm of the sum */
    bool dropout;   /* the embeddings' dropout (the builders keep its mask in
                       evaluation too: chain_embed.c) */
    bool vocab_parallel; /* Megatron's VocabParallelEmbedding: the ids outside
                            the rank's rows masked, the rest shifted */
    uint8_t rotary; /* mlg_rotary: the cos and sin (or DeepSeek-V2's complex
                       freqs_cis) every layer reads, kept here */
    /* sizes: the position table's rows, the token types, the rotated part
     * of a head; the image's C*H*W, a patch's C*P*P, the patches, T*D (the
     * positions' one vector) */
    uint64_t positions, ntypes, rot, image, kin, npatches, td;
} mlg_embed;

/* m's embedding's settings at configuration c (drop: the dropout runs;
 * the sizes are the caller's, ledger/chain_graph.c); false when the kit
 * does not express it. */
bool ml__family_embedding(const ml_model *m, const mlg_config *c, bool drop, mlg_embed *E);
/* Its graph into g (a fresh graph). */
void ml__kit_embedding(ml_graph *g, const mlg_embed *E);

#endif
