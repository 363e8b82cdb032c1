/* The kit the chain is written with (the op graph's passes in
 * chain_graph.c, and the chain files around them): opening and closing a
 * block, recording a saved storage, an unsaved intermediate, a parameter
 * tensor or a backward node. Internal to src/ledger/: the `ml__ck_` prefix
 * marks functions that cross files but are not the library's API.
 * Formulas and sources: docs/inventory.md. */
#ifndef ML_CHAIN_KIT_H
#define ML_CHAIN_KIT_H

#include "graph/families.h"
#include "graph/graph.h"
#include "graph/kit_seq.h"
#include "ledger/chain.h"

/* Shapes of a transformer block (or of a sequential attention layer). */
typedef struct {
    uint64_t B, T, BT, D, F, H, Hkv, dh, Dkv, V;
    /* sequence parallelism (docs/parallel.md): its ranks (1: none), and the
     * rows of the residual stream a rank holds, BT / sp */
    uint64_t sp, BTs;
    /* context parallelism: its ranks (1: none); T is then a rank's share of
     * the sequence, T x cp the whole */
    uint64_t cp;
    /* expert parallelism: its ranks (1: none); expert tensor
     * parallelism's; whether the experts' dispatch runs */
    uint64_t ep, etp;
    bool dispatch;
    /* training.expert_capacity (0: none) and expert_pad, under the dispatch */
    double capacity;
    bool pad;
    bool drop;
    double expert_imbalance; /* training.expert_imbalance (mixtures of experts) */
} ml_ck_dims;

uint64_t ml__ck_mul3(ml_chain *ch, uint64_t a, uint64_t b, uint64_t c);

/* Appends a block named `name`; NULL (and ch->nomem) when out of memory. */
ml_cblock *ml__ck_begin(ml_chain *ch, const char *name, int ckpt_index);
/* Records one saved storage of `elems` elements of `bpe` bytes; returns its
 * index in ch->saved, SIZE_MAX when it is not listed (the block's input). */
size_t ml__ck_save(ml_chain *ch, ml_cblock *b, const char *what, uint64_t elems, unsigned bpe,
                unsigned flags);
/* An intermediate that nothing saves. */
void ml__ck_tmp(ml_chain *ch, uint64_t elems, unsigned bpe);
/* A parameter tensor of the block: rows x cols (cols 0 for a vector). */
void ml__ck_param(ml_chain *ch, ml_cblock *b, uint64_t rows, uint64_t cols);
/* Records the backward node of the op just built (forward order: ml__ck_end
 * puts the block's nodes in execution order) when ch->record_nodes; it
 * releases the saved storages s0 and s1 (SIZE_MAX: none). */
void ml__ck_node(ml_chain *ch, ml_cblock *b, const char *what, uint64_t grad_in,
                 uint64_t param_grad, uint64_t grad_out, size_t s0, size_t s1);
/* A further saved storage s the node just recorded releases. */
void ml__ck_node_claim(ml_chain *ch, ml_cblock *b, size_t s);
/* Scratch of the node just recorded (allocated and freed inside it). */
void ml__ck_node_scratch(ml_chain *ch, ml_cblock *b, uint64_t bytes);
/* InputBuffer accumulation: a gradient of `bytes` added in place into the
 * buffer already held for the same tensor (input_buffer.cpp), then freed. */
void ml__ck_accum(ml_chain *ch, ml_cblock *b, uint64_t bytes);
/* The node just recorded, to name its gradients' tensors (ml_bnode.gin_id
 * ...); NULL when no node list is recorded. */
ml_bnode *ml__ck_last_node(ml_chain *ch, ml_cblock *b);
/* The gradient id of graph tensor t (chain_grads.c); the ids and bytes of
 * node n's gradients from op o at bytes tb (n NULL: nothing), accum: the
 * accumulation node before it frees the one made for o->accum. */
uint16_t ml__ck_grad_id(const ml_graph *g, uint16_t t);
void ml__ck_node_parts(ml_bnode *n, const ml_graph *g, const mlg_op *o, const uint64_t *tb,
                       bool accum);
/* An accumulation node n's gradient: the one just made for tensor t. */
void ml__ck_accum_parts(ml_bnode *n, const ml_graph *g, uint16_t t, const uint64_t *tb);
/* Where op a's gradient is added into the buffer of its input o->accum
 * (the block's incoming gradient) while a node still to run holds the
 * buffer's sum, handed to it by sums that complete first (GPT-NeoX's
 * attention branch, its output summed with the MLP's before the skip):
 * that node's op, the last holder, else MLG_NONE (added in place). */
uint16_t ml__ck_accum_shared(const ml_graph *g, uint16_t a);
/* Over g's ops (MLG_MAX_OPS entries each): oop[a], op a's accumulation
 * adds out of place; carry[c], the bytes of the old sum op c's node frees,
 * the last holder (ml__ck_accum_shared). */
/* Returns the op whose accumulation is the first, in backward order, into
 * the buffer that holds the block's incoming gradient: its target's
 * gradient passed on by sums (no node) up to a tensor no node makes the
 * gradient of; MLG_NONE: none. */
uint16_t ml__ck_accum_plan(const ml_graph *g, const uint64_t *tb, bool *oop, uint64_t *carry);
/* The accumulation node of op o's input gradient (o->accum), run after o's
 * node: in place, or out of place (oop: a new sum made, accum_copy);
 * incoming: the first into the incoming gradient's buffer
 * (ml__ck_accum_incoming; ml_bnode.into_incoming). */
void ml__ck_accum_node(ml_chain *ch, ml_cblock *b, const ml_graph *g, const mlg_op *o,
                       const uint64_t *tb, bool oop, bool incoming);
/* ml_cblock.hand_gid of a block from graph g: 1 + its input's gradient id,
 * 0 where that is the incoming gradient passed down. */
uint16_t ml__ck_hand_gid(const ml_graph *g);
/* Closes a block: transients, gradients its backward creates. */
void ml__ck_end(ml_chain *ch, ml_cblock *b, uint64_t out_bytes);

/* Sets b->ws_nograd from a complete program: one that ends holding the
 * block's output (out bytes, 0 for a view of the input) and `kept` bytes
 * more (autocast's weight copies, which the replay makes after the
 * transient where it is not known op by op). The replay holds ws_nograd
 * beside the output, so ws_nograd is the program's peak less the output.
 * An incomplete program leaves the block rule. */
void ml__ck_ng_close(ml_cblock *b, const ml_graph_live *g, uint64_t out, uint64_t kept);
/* The same for a program with grad, whose saved tensors stay: complete
 * when it ends holding the block's saved tensors and its output; sets
 * b->ws_fwd, what the replay holds beside them while the block runs. */
void ml__ck_grad_close(ml_cblock *b, const ml_graph_live *g, uint64_t out);
/* The busiest expert's rows among N (token, expert) pairs over E experts:
 * N / E for a balanced router, times training.expert_imbalance, at most the
 * B*T tokens (one row per token and expert). */
uint64_t ml__ck_busiest_rows(const ml_ck_dims *d, uint64_t N, uint64_t E);
/* The experts that take some of the N routed rows (HF's expert_hitted),
 * in expert order, as at most three runs of experts with equal rows:
 * count[i] experts of rows[i] rows each (chain_moe_mixtral.c: the
 * balanced share, or the busiest expert first with
 * training.expert_imbalance). Returns the number of runs. */
unsigned ml__ck_expert_runs(const ml_ck_dims *d, uint64_t N, uint64_t E, uint64_t count[3],
                            uint64_t rows[3]);
/* The same for the E / ep experts the fullest rank holds under the
 * dispatch (d->ep x d->etp ranks, each with N pairs): the runs of the
 * group's pairs over the E experts, the first E / ep of them (the busiest
 * expert first), each at most the group's capacity (or exactly it,
 * padded); ml__ck_expert_runs without the dispatch. */
unsigned ml__ck_ep_runs(const ml_ck_dims *d, uint64_t N, uint64_t E, uint64_t count[3],
                        uint64_t rows[3]);
/* The busiest expert's rows the fullest rank takes: ml__ck_busiest_rows
 * over the group's pairs under expert parallelism. */
uint64_t ml__ck_ep_busiest_rows(const ml_ck_dims *d, uint64_t N, uint64_t E);
/* Megatron's expert capacity of a rank's N pairs over E experts
 * (moe_utils.py get_capacity: ceil(N / E x training.expert_capacity)); 0:
 * none. */
uint64_t ml__ck_ep_capacity(const ml_ck_dims *d, uint64_t N, uint64_t E);
/* The pairs a rank sends of its N under the dispatch (*sent: N, or with
 * an expert capacity each expert's share of them up to it, the rest
 * dropped, or E times it padded), and of those the ones that stay (*self:
 * its own pairs for the E / ep experts it holds, the first ones, as the
 * fullest rank holds them) (chain_moe_mixtral.c). */
void ml__ck_ep_own(const ml_ck_dims *d, uint64_t N, uint64_t E, uint64_t *sent,
                   uint64_t *self);
/* Whether the model's attention runs a fused kernel (no T x T tensor) at
 * the compute dtype's bytes. */
bool ml__ck_fused_attention(unsigned compute_bytes, const ml_model *m);

/* The decoder layouts whose forward and backward are written out op by op
 * under autocast too, as a CUDA-autocast twin checks them
 * (tests/torch/livebytes.py): GPT-2's and Llama's (LayerNorm with learned
 * positions, or Llama's RMSNorm; a dense MLP; eager attention). */
bool ml__ck_autocast_ops(const ml_model *m);
/* Whether the transformer's blocks record their backward nodes
 * (chain_head.c; docs/ledger.md, "Backward, node by node"). */
bool ml__ck_node_level(const ml_chain *ch, const ml_model *m);
/* The head block, then the loss (chain_head.c), from their op graphs;
 * ML_NOMEM, or ML_RANGE when the graph declines one. */
ml_status ml__ck_head_and_loss(ml_chain *ch, const ml_model *m, const ml_ck_dims *d,
                               const ml_training *t);

/* The transformer's embedding block (chain_embed.c), from its op graph;
 * ML_NOMEM, or ML_RANGE when the graph declines it. */
ml_status ml__ck_embedding_block(ml_chain *ch, const ml_model *m, const ml_ck_dims *d);
/* The rotary's inv_freq buffer of a model of head size dh: the rotated
 * part's half, fp32 (0 without rotary positions); every pipeline chunk has
 * its own (pipeline.c). */
uint64_t ml__ck_inv_freq_bytes(const ml_model *m, uint64_t dh);

/* The shapes of one micro-batch through a transformer (chain_transformer.c);
 * ML_RANGE (with err) when the sequence does not fit the model. */
ml_status ml__ck_dims_of(const ml_model *m, const ml_training *t, ml_chain *ch, ml_ck_dims *d,
                         ml_error *err);
/* The model's layer blocks, "block.<i>", checkpoint indices from
 * ch->mask_ckpt0 (chain_transformer.c), from their op graphs; ML_NOMEM,
 * or ML_RANGE when the graph declines a layer (no chain builder writes
 * one). */
ml_status ml__ck_layer_blocks(ml_chain *ch, const ml_model *m, const ml_ck_dims *d);
/* ML_RANGE with the reason in err: the op graph declined the model's
 * `part` ("embedding", "layers", "head"), which no other rule plans; the
 * message names the model and its layout. */
ml_status ml__ck_declined(const ml_model *m, const char *part, ml_error *err);
/* ml__ck_declined for the layers (ml__ck_layer_blocks returned ML_RANGE). */
ml_status ml__ck_layers_declined(const ml_model *m, ml_error *err);

/* A side tensor (chain.h) made by block `from`'s forward and freed after
 * block `to`'s, with no gradient (the caller sets the other fields); NULL
 * when bytes is 0 (none) or out of memory (ch->nomem set). */
ml_side *ml__ck_side(ml_chain *ch, const char *what, uint64_t bytes, size_t from, size_t to);

/* A layer's op graph at the chain's sizes (chain_graph.c; docs/graph.md). */
typedef struct {
    ml_graph g;
    ml_graph_sizes z;
    uint64_t tb[MLG_MAX_TENSORS]; /* each tensor's bytes */
    bool programs;                /* the forward's live bytes come from the graph */
    uint8_t out_cache_bpe;        /* training with HF use_cache: bytes an element of
                                     the cache's keys and values that no op
                                     saves (ml__ck_out_cache); 0: none */
} ml_ck_graph;
/* Builds the graph of m's layers into G when the component kit expresses
 * their layout (graph/families.c); false: it declines them (the chain is
 * refused). */
bool ml__ck_graph_layer(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, ml_ck_graph *G);
/* Node nn's scratch, made by op o of block b's graph G: the formula's
 * own (o->scratch_in tensors of its first input gradient's size, made one
 * by one where nothing else adds to them), sequence parallelism's
 * collectives and ring attention's buffers. */
void ml__ck_op_scratch(ml_chain *ch, ml_cblock *b, const ml_ck_graph *G, const mlg_op *o,
                       const uint64_t *tb, ml_bnode *nn);
/* The bytes ring attention's backward holds besides a fused kernel's own
 * (context_parallel.c; 0 without context parallelism): every rank's keys
 * and values gathered again, the query gradient's fp32 accumulator and its
 * update's copy, the fp32 key/value gradients passed around the ring. */
uint64_t ml__cp_ring_backward(ml_chain *ch, const ml_graph_sizes *z);
/* Expert parallelism's dispatch buffers for an MoE block built from G
 * (expert_parallel.c): the forward's beside the saved tensors and under
 * no_grad, the backward's beside the block rule's. Nothing without ep. */
void ml__ep_dispatch(ml_chain *ch, ml_cblock *b, const ml_ck_graph *G);
/* ... of layer `layer` (its layout: DeepSeek's first dense_layers layers
 * have a dense MLP, the others experts); ml__ck_graph_layer is layer 0's. */
bool ml__ck_graph_layer_at(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, uint64_t layer,
                           ml_ck_graph *G);
/* The same for a decoder's head (the final norm and the LM head; fused:
 * the norm alone). */
bool ml__ck_graph_head(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, bool fused,
                       ml_ck_graph *G);
/* The graph of a transformer's embedding block (graph/kit_embed.h) into
 * G; false: it declines it (the chain is refused). */
bool ml__ck_graph_embedding(ml_chain *ch, const ml_model *m, const ml_ck_dims *d,
                            ml_ck_graph *G);
/* The same for a decoder's sequence-classification head (graph/kit_head.h). */
bool ml__ck_graph_cls_head(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, ml_ck_graph *G);
/* The same for an encoder's classifier head (BERT's pooler and
 * classifier, ViT's; graph/kit_head.h). */
bool ml__ck_graph_encoder_head(ml_chain *ch, const ml_model *m, const ml_ck_dims *d,
                               ml_ck_graph *G);
/* The same for BERT's masked-LM head (graph/kit_head.h). */
bool ml__ck_graph_mlm_head(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, ml_ck_graph *G);
/* The same for the fused linear cross-entropy's loss block. */
bool ml__ck_graph_fused_loss(ml_chain *ch, const ml_model *m, const ml_ck_dims *d,
                             ml_ck_graph *G);
/* The graph of the cross-entropy block over rows x classes logits
 * (graph/kit_head.h) into G; false: it declines it (the chain is refused). */
bool ml__ck_graph_loss(ml_chain *ch, uint64_t rows, uint64_t classes, ml_ck_graph *G);
/* Megatron's vocab-parallel cross-entropy (graph/kit_head.c) */
bool ml__ck_graph_megatron_loss(ml_chain *ch, uint64_t rows, uint64_t classes, ml_ck_graph *G);
/* The same for a sequential model's mean-squared-error block on n
 * elements of in_bytes each (graph/kit_head.h). */
bool ml__ck_graph_mse_loss(ml_chain *ch, uint64_t n, unsigned in_bytes, ml_ck_graph *G);
/* The graph of a multimodal model's vision layer (LLaVA's CLIP tower,
 * graph/kit_clip.c; pool, an mlg_clip_pool: the last layer's post_layernorm) at the tower's
 * shapes vd into G; false: it declines it (the chain is refused). */
bool ml__ck_graph_vision_layer(ml_chain *ch, const ml_model *m, const ml_ck_dims *vd,
                               unsigned pool, ml_ck_graph *G);
/* LLaVA's CLIPVisionEmbeddings with pre_layrnorm from the op graph
 * (graph/kit_clip.c) at the tower's shape vd into G; false: it declines
 * it (the chain is refused). */
bool ml__ck_graph_clip_embedding(ml_chain *ch, const ml_model *m, const ml_ck_dims *vd,
                                 ml_ck_graph *G);
/* LLaVA's projector and the merge of the image features into the token
 * embeddings (graph/kit_clip.c): the tower's shape vd, the decoder's d,
 * n_img image tokens a sample. False, the chain refused: the graph
 * not whole, or a tower more than six times the decoder's width (Dv w >
 * 24 Dt) whose whole hidden state linear_1 keeps (feature_select full, no
 * autocast): the graph lists that input (the block's, saved) where the
 * block rule's largest tensor is read, the builders did not, and only the
 * indices' (B n Dt x 24 bytes) hide it below that width. */
bool ml__ck_graph_llava_projector(ml_chain *ch, const ml_model *m, const ml_ck_dims *vd,
                                  const ml_ck_dims *d, uint64_t n_img, ml_ck_graph *G);
/* Whether LLaVA's linear_1 keeps the feature layer's whole hidden state
 * (its input a view of it, not autocast's copy): feature_select full, or a
 * tower batch of `images` one, whose feature slice folds to rows as a view
 * (docs/inventory.md, "A batch of one"); else it keeps a copy of the
 * slice. */
bool ml__ck_llava_keeps_hidden(const ml_chain *ch, const ml_model *m, uint64_t images);
/* T5's embedding of d->T ids from the op graph (graph/kit_embed.c): the
 * lookup and its dropout; shared: the table is the encoder's (the
 * decoder's embedding registers none). False: the graph declines it. */
bool ml__ck_graph_t5_embedding(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, bool shared,
                               ml_ck_graph *G);
/* What of the configuration changes a graph's ops; G's sizes at the
 * chain's shape d with each tensor's bytes (false: G is not whole); the
 * dtype classes' bytes and each tensor's again, after a caller's own sizes
 * (chain_graph.c). */
mlg_config ml__ck_graph_config(const ml_chain *ch, const ml_model *m);
bool ml__ck_graph_sized(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, ml_ck_graph *G);
void ml__ck_graph_dtype_bytes(ml_chain *ch, ml_ck_graph *G);
/* The graph of T5's layer (graph/kit_t5.h) of the encoder (decoder
 * false) or the decoder, the stack's first or another, over d's tokens
 * (Ts: the encoder's, the keys of a decoder's cross-attention). */
bool ml__ck_graph_t5(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, uint64_t Ts,
                     bool decoder, bool first, ml_ck_graph *G);
/* The graph of T5's encoder.final (its final_layer_norm, dropout) over d's
 * tokens; false: it declines it (the chain is refused). */
bool ml__ck_graph_t5_final(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, ml_ck_graph *G);
/* The same for T5's head (the decoder's final norm, lm_head) over d's
 * tokens, the targets. */
bool ml__ck_graph_t5_head(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, ml_ck_graph *G);
/* T5's side tensors as its op graphs have them (docs/graph.md, "T5's side
 * tensors"): each tensor a graph flags MLG_T_SIDE, in the order the noted
 * graphs make them. */
typedef struct {
    const char *name;
    uint64_t bytes;
    size_t from;        /* the block whose graph makes it */
    size_t first, last; /* the first and last blocks whose ops read it */
    size_t scope;       /* the block whose forward's end frees it (a stack's
                           local); SIZE_MAX: the model's forward holds it */
    bool saved;         /* a reader's op saves it itself */
    bool grad;          /* the op that makes it is differentiable */
    bool arg;           /* a layer's graph has it: an argument of the
                           checkpointed blocks */
} ml_ck_side;
typedef struct {
    ml_ck_side s[16];
    unsigned n;
    bool refused; /* more than s holds, a tensor read before made, or a
                     block not from its graph: the chain builders write
                     the list */
} ml_ck_sides;
/* Notes the side tensors of G, emitted (or repeated, or only noted: T5's
 * stack) as block `block`; layer: G is a layer's. One G makes starts an
 * entry (scope: as in ml_ck_side); one it reads joins the latest entry of
 * its name. */
void ml__ck_t5_sides_note(const ml_ck_graph *G, size_t block, size_t scope, bool layer,
                          ml_ck_sides *S);
/* Adds S's entries to ch's side tensors (chain.h; loss: the model
 * forward's last block); out of memory: ch->nomem. */
void ml__ck_t5_sides_add(ml_chain *ch, const ml_ck_sides *S, size_t loss);
/* The graph of T5Stack's own tensors (graph/kit_t5.h) over d's tokens (Ts:
 * the encoder's); false: not T5's layout or not whole. */
bool ml__ck_graph_t5_stack(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, uint64_t Ts,
                           bool decoder, ml_ck_graph *G);
/* The graph of a sequential model's layer l (one `layers:` entry) on an
 * input of shape in (in_bytes per element; in_nograd: the model's input)
 * into G at the chain's micro-batch and precision (graph/kit_seq.h);
 * false: the graph declines it (info->overflow: a size past 64 bits),
 * and no other rule plans it. */
bool ml__ck_graph_seq(ml_chain *ch, const ml_layer *l, const ml_shape *in, unsigned in_bytes,
                      bool in_nograd, ml_ck_graph *G, mlg_seq_block *info);
/* Block b's inventory, nodes, parameters, FLOPs and transients from G,
 * closed with output bytes out (ml__ck_end), then its forward programs. */
void ml__ck_graph_emit(ml_chain *ch, ml_cblock *b, const ml_ck_graph *G, uint64_t out);
/* Under autocast (chain_autocast.c): op o's weight copy, the graph
 * tensor it saves flagged MLG_T_WCAST (MLG_NONE: o is no product with
 * parameters, or saves none); its input copy (MLG_NONE: it reads the
 * tensor its gradient goes to). */
uint16_t ml__ck_autocast_weight(const ml_graph *g, const mlg_op *o);
uint16_t ml__ck_autocast_input(const ml_graph *g, const mlg_op *o);
/* Whether o's node is MmBackward0 of a product without bias, which makes
 * its weight's gradient before its input's (chain_autocast.c). */
bool ml__ck_mm_node(const mlg_op *o);
/* The ToCopyBackward0 nodes of product o's copies at bytes tb, before its
 * own node in the forward order the list is built in: its bias's and its
 * weight's (w: the weight copy; *pg becomes the product's own), then its
 * input's (c: the input copy, MLG_NONE: none; accum: its gradient goes
 * into an InputBuffer accumulation, whose node the caller adds between the
 * two, to run right after the input's). *gin becomes the product's own. */
void ml__ck_autocast_param_copies(ml_chain *ch, ml_cblock *b, const ml_ck_graph *G,
                                  const mlg_op *o, uint16_t w, const uint64_t *tb, uint64_t *gin,
                                  uint64_t *pg);
void ml__ck_autocast_input_copy(ml_chain *ch, ml_cblock *b, const ml_ck_graph *G,
                                const mlg_op *o, uint16_t c, const uint64_t *tb, uint64_t *gin,
                                bool accum);
/* The gradients product o's own node (the list's last) makes and reads:
 * its input copy's c (else its input's, added into the buffer: acc), its
 * weight copy's and its bias copy's. */
void ml__ck_autocast_parts(ml_chain *ch, ml_cblock *b, const ml_ck_graph *G, const mlg_op *o,
                           uint16_t w, uint16_t c, const uint64_t *tb, bool acc);
/* Block b's forward without grad from graph g at bytes tb, ending with
 * `held` bytes (its output): its transient (ml__ck_ng_close) and, where
 * that is found op by op, its steps (chain.h, ml_fstep; chain_fsteps.c). */
void ml__ck_nograd(ml_chain *ch, ml_cblock *b, const ml_graph *g, const uint64_t *tb,
                   uint64_t held);
/* The same with grad: its transient (ml__ck_grad_close) and, where that
 * is found op by op and the steps' saved allocations fill b's saved
 * entries exactly (idx[e]: graph entry e's index in ch->saved, SIZE_MAX:
 * none), its steps (b->gstep_*). */
void ml__ck_grad(ml_chain *ch, ml_cblock *b, const ml_graph *g, const uint64_t *tb,
                 uint64_t held, const size_t *idx);
/* Block b as a copy of the identical block ch->blocks[proto] (the same
 * graph at the same sizes), whose parameters are ch->params[pfirst ..
 * pfirst + pcount): a configuration's layers are emitted once. */
void ml__ck_graph_repeat(ml_chain *ch, ml_cblock *b, size_t proto, size_t pfirst, size_t pcount);

/* The families' builders, called by ml__chain_build. */
ml_status ml__chain_build_transformer(const ml_model *m, const ml_config *cfg, ml_chain *ch,
                                      ml_error *err);
ml_status ml__chain_build_sequential(const ml_model *m, const ml_config *cfg, ml_chain *ch,
                                     ml_error *err);
ml_status ml__chain_build_t5(const ml_model *m, const ml_config *cfg, ml_chain *ch,
                             ml_error *err);
ml_status ml__chain_build_llava(const ml_model *m, const ml_config *cfg, ml_chain *ch,
                                ml_error *err);
/* A sequential model's loss block b's inventory from the op graph:
 * cross-entropy on rows rows of n elements in all, or mean squared error
 * on n elements of in_bytes each; *taken false: the graph declines it
 * (the chain is refused). ML_NOMEM. */
ml_status ml__ck_seq_loss_graph(ml_chain *ch, ml_cblock *b, bool ce, uint64_t rows, uint64_t n,
                                unsigned in_bytes, bool *taken);
/* The cross-entropy block over `rows` rows of `classes` logits
 * (chain_head.c); ML_NOMEM. */
ml_status ml__ck_ce_loss(ml_chain *ch, const ml_model *m, const ml_ck_dims *d, uint64_t rows,
                         uint64_t classes);

#endif
