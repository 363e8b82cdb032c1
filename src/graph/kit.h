/* The component kit: norms, linears, attention, MLPs, dropouts and
 * residual adds that emit their ops into a block's graph (graph.h), each
 * with what PyTorch's eager autograd saves and runs for it
 * (tools/autograd/derivatives.yaml; docs/inventory.md names the reference
 * implementation of each). A family is a composition of these
 * (families.c); docs/adding-a-family.md walks through one. */
#ifndef ML_GRAPH_KIT_H
#define ML_GRAPH_KIT_H

#include "graph/graph.h"

typedef enum { MLG_LAYERNORM, MLG_RMSNORM, MLG_OLMO_LAYERNORM, MLG_GEMMA_RMSNORM } mlg_norm_kind;
/* MLG_GELU_NEW: transformers' gelu_new, a composite of elementwise ops
 * (kit_gelu.c) */
typedef enum { MLG_GELU, MLG_RELU, MLG_SWIGLU, MLG_GEGLU, MLG_QUICK_GELU, MLG_GELU_NEW } mlg_act;

/* LayerNorm (native_layer_norm); HF LlamaRMSNorm: x in fp32 (a copy when
 * the stream is not: upcast), x * rsqrt(mean(x^2) + eps), cast back, times
 * the weight; HF OlmoLayerNorm: native_layer_norm of x in fp32 (a copy when
 * the stream is not) without weight or bias, cast back; HF GemmaRMSNorm:
 * LlamaRMSNorm's normalisation times (1 + weight) in fp32, cast back. */
typedef struct {
    uint8_t kind; /* mlg_norm_kind */
    bool bias;
    bool upcast; /* RMSNorm on an input that is not fp32 */
    bool held;   /* its output's gradient is a buffer the residual's skip holds
                    (Gemma 2's post norms): its last node frees none */
} mlg_norm;

/* Self-attention, eager or a fused kernel.
 * nanoGPT's CausalSelfAttention (hf false): one c_attn projection sliced
 * into q, k and v; masked_fill with a causal (T, T) bool mask; the softmax
 * in the stream's dtype (fp32 under autocast, which casts the
 * probabilities back for the PV matmul).
 * HF LlamaAttention with eager_attention_forward (hf true): q_proj, k_proj,
 * v_proj; rotate-half rotary; repeat_kv for grouped heads; an additive
 * causal mask; softmax in fp32, cast back to the compute dtype, then
 * dropout; the weights returned and held by the layer until it returns.
 * HF ViTSelfAttention is that layout without rotary or mask. */
typedef struct {
    bool hf;
    bool qkv_bias, out_bias;
    bool fused_kernel;   /* sdpa or flash as dispatched: no T x T tensor */
    bool ring;           /* the fused kernel as context parallelism's ring
                            attention: its buffers (ml__kit_ring_buffers) */
    bool dropout;        /* on the probabilities and the output */
    bool rope;           /* rotary on q and k (hf) */
    bool grouped;        /* fewer key/value heads than query heads (hf) */
    bool repeat_copy;    /* repeat_kv's reshape copies (more than one kv head) */
    bool kv_one, q_one;  /* one key/value head, one query head: that head
                            view's backward reshapes the transposed gradient
                            as a view, no copy */
    bool fold_views;     /* a batch of one: at::matmul's reshape of a
                            (1, H, T, x) operand to (H, T, x) for bmm is a
                            view whatever its strides (a dimension of size
                            one merges with any), so bmm saves the operand
                            as it is (a head view: its projection's whole
                            output; one expanded key/value head: that head)
                            and makes no contiguous copy */
    bool softmax_copy;   /* softmax(dtype=fp32) of a bf16 input copies it first */
    bool probs_cast;     /* the fp32 probabilities cast back (compute not fp32) */
    bool rot_fp32;       /* the rotary's products in the stream's dtype (fp32
                            under autocast: transformers makes cos and sin in
                            the hidden states' dtype, and autocast lists no
                            mul, add or cat), so the rotated q and k, k's
                            repeat_kv and the q k^T matmul's inputs are
                            autocast's copies of them; `.to(query.dtype)`
                            then copies nothing: the layer keeps the fp32
                            probabilities, and the PV matmul reads autocast's
                            copy of them */
    bool cache;          /* evaluation with a KV cache: k and v held to the
                            layer's end (HF DynamicCache) */
    bool softcap;        /* Gemma 2's scores / cap, tanh, * cap (eager only) */
    bool mask;           /* an additive causal mask on the scores (hf: the
                            decoders'; an image encoder has none) */
    bool fused_softmax;  /* nanoGPT's scale, masked_fill and softmax as one kernel
                            that saves its output only (Megatron-core's) */
    bool unmasked;       /* nanoGPT's layout without its masked_fill (a
                            sequential model's attention layer with causal:
                            false, graph/kit_seq.c) */
    bool fused_proj;     /* Phi-3's one qkv_proj: q, k and v slices of its
                            output; its rotary splits the head into the
                            rotated part and an empty pass, then cats */
    bool heads_first;    /* with fused_proj, GPT-NeoX's order: the output
                            viewed into heads (B, T, H, 3 dh), transposed,
                            then chunked into q, k and v (Phi-3's slices
                            first, then views each) */
    bool o_first;        /* o_proj registered before the projections (Phi-3) */
    bool in_buf;         /* the projections' input gradient buffer exists (a
                            post-norm layer's input, which the skip holds) */
    bool bert;           /* HF BertSelfAttention: softmax in the stream's
                            dtype, then dropout, then the PV matmul's cast
                            (nanoGPT's order); the masked scores stay bound
                            until it returns the context alone, which stays
                            bound until BertAttention returns */
    bool q_last;         /* HF ViTSelfAttention: k, v, then q projected (and
                            viewed into heads), so backward runs q, v, k */
    bool self_out;       /* HF ViTSelfAttention: it returns the context alone
                            (q, k, v and the probabilities go with it), the
                            output projection a module of its own
                            (ViTSelfOutput); the context stays bound until
                            the attention module returns */
    bool out_grad;       /* the output projection frees its output's gradient
                            (a dropout or a post norm made it) */
    bool split_heads;    /* HF FalconAttention: query_key_value cut by
                            _split_heads, q, k and v each reshaped into
                            contiguous (B, h, T, dh) heads (kit_falcon.c):
                            bmm copies only the heads it expands */
    bool math;           /* sdpa as its math kernel runs it (kit_math.c): the
                            kernel's own causal mask, repeat_interleave for
                            grouped heads, q and k^T scaled, _safe_softmax */
    bool latent;         /* DeepSeek's multi-head latent attention (kit_mla.c) */
    bool q_lora;         /* ... with q compressed (q_a_proj, its norm, q_b_proj) */
    bool stream_softmax; /* the mask, in the stream's dtype, promotes the
                            scores to it and softmax(dtype=hidden_states.dtype)
                            keeps them there (Falcon): its output is cast for
                            the PV matmul where that is not the compute dtype */
} mlg_attention;

typedef struct {
    uint8_t act; /* mlg_act */
    bool bias;
    bool dropout;  /* on the output */
    bool out_grad; /* the last projection frees its output's gradient */
    bool fused;    /* Phi-3's one gate_up_proj, chunked into gate and up */
    bool in_buf;   /* its input's gradient buffer exists (post-norm: the skip
                      holds it): its first projection's is added */
    bool keep_act; /* the activation's output stays bound until the layer
                      returns (BERT's feed_forward_chunk) */
    bool in_gone;  /* its input goes once the activation is made, before the
                      down projection (ViT: ViTIntermediate returns and the
                      layer rebinds its input to the activation's output) */
} mlg_mlp;

/* A mixture-of-experts MLP in place of the dense one (kit_moe.c). */
typedef enum {
    MLG_MOE_NONE,
    MLG_MOE_DEEPSEEK_V3,
    MLG_MOE_DEEPSEEK_V2,
    MLG_MOE_MIXTRAL, /* Mixtral's and Qwen2-MoE's (kit_mixtral.c) */
} mlg_moe_kind;
typedef struct {
    uint8_t kind;  /* mlg_moe_kind */
    bool renorm;   /* the top-k weights renormalised (V3's and Qwen2-MoE's
                      norm_topk_prob; Mixtral's always) */
    bool grouped;  /* V2's group_limited_greedy: a bool mask over the scores */
    bool shared;   /* shared experts on every token (Qwen2-MoE's: one, gated) */
    bool h32;      /* the norm's output is fp32 (the stream's dtype) */
    bool ep;       /* the experts' dispatch (Mixtral's kind, under expert,
                      expert-tensor or tensor parallelism): the rank's experts
                      run on the rows an all-to-all brings it (kit_mixtral.c) */
    bool ep_one;   /* with ep: the expert-parallel group is one rank (its
                      all-to-all returns its input) */
    bool etp;      /* with ep: the expert-tensor ranks' all-gather of the
                      rows and reduce-scatter of the outputs */
    bool one_local;/* with ep: one expert on the rank (Megatron sorts nothing
                      by local expert, and SequentialMLP neither splits nor
                      concatenates) */
} mlg_moe;

/* A layer: its components and how they are wired. */
typedef struct {
    mlg_norm norm;
    mlg_attention attn;
    mlg_mlp mlp;
    bool autocast; /* torch.autocast: linears read low-precision cast copies */
    bool hf_order; /* HF's decoder layers register self_attn, mlp, then the
                      norms (parameter order) */
    bool post_norms; /* Gemma 2: a norm (post) on each branch's output before
                        its residual add */
    bool parallel;   /* GPT-NeoX: x + attn(norm(x)) + mlp(norm2(x)), both
                        norms of the layer's input */
    bool shared_norm; /* Falcon: with parallel, one norm feeds both branches,
                         mlp(h) += attn(h), then x + that */
    bool postnorm;   /* BERT: norm(x + attn(x)), then norm(. + mlp(.)) */
    bool hold_attn;  /* ViT: the attention's output stays bound until the
                        layer returns (ViTLayer.forward's attention_output) */
    mlg_norm post;
    mlg_moe moe;     /* experts in place of the dense MLP (kind MLG_MOE_NONE: none) */
    mlg_norm latent; /* latent attention's norms of its compressed q and kv
                        (attn.latent; their widths the kit's) */
} mlg_layer;

/* Parameter groups: the order modules register their parameters in. */
enum {
    MLG_GROUP_NORM1,
    MLG_GROUP_ATTN_O, /* an attention's output projection registered first */
    MLG_GROUP_ATTN,
    MLG_GROUP_POST_ATTN,
    MLG_GROUP_NORM2,
    MLG_GROUP_MLP,
    MLG_GROUP_POST_MLP,
    MLG_GROUP_MLP2, /* a mixture of experts' modules after its first ones */
    MLG_GROUP_MLP3, /* ... and after those (kit_moe.c) */
    MLG_GROUPS
};

/* A Linear on x (in -> out wide: named dimensions) making y; returns its
 * op. autocast with an fp32 x saves a cast copy of x and of the weight. */
typedef struct {
    const char *name, *node;
    uint8_t in, out; /* mlg_dim */
    bool bias;
} mlg_linear;
mlg_op *ml__kit_linear(ml_graph *g, const mlg_layer *L, const mlg_linear *lin, uint16_t x,
                       uint16_t y);
/* The same with the copies made by the caller (c: x's, w: the weight's;
 * MLG_NONE: none): the cast ops, then the linear. */
mlg_op *ml__kit_linear_with(ml_graph *g, const mlg_linear *lin, uint16_t x, uint16_t c,
                            uint16_t w, uint16_t y);
/* A parameter of rows (x cols; cols < 0: a vector) in the current group. */
uint16_t ml__kit_param(ml_graph *g, const char *name, uint8_t rows, int cols);
/* The cast ops making autocast's copies c of x and w of the weight W
 * (MLG_NONE: none), before the op that reads them. */
void ml__kit_cast_ops(ml_graph *g, uint16_t x, uint16_t c, uint16_t w, uint16_t W);
/* autocast's copy of an fp32 x (MLG_NONE: none), of a weight (in x out). */
uint16_t ml__kit_cast_copy(ml_graph *g, const mlg_layer *L, uint16_t x);
uint16_t ml__kit_weight_copy(ml_graph *g, const mlg_layer *L, uint8_t in, uint8_t out);
/* A (B, h, T, dh) tensor in the compute dtype; a (B, H, T, T) one. */
uint16_t ml__kit_heads(ml_graph *g, const char *name, uint8_t h);
/* The same in dtype class dt. */
uint16_t ml__kit_heads_as(ml_graph *g, const char *name, uint8_t h, uint8_t dt);
/* The op viewing y into the heads hv (name): its backward (node, a
 * ViewBackward0) copies the transposed gradient back; node NULL: that
 * gradient reshapes as a view, no node, the heads' gradient y's
 * (kit_core.c). */
void ml__kit_view_heads(ml_graph *g, const char *name, const char *node, uint16_t y, uint16_t hv);
/* Context parallelism's ring attention (PyTorch's
 * torch.distributed.tensor.experimental context_parallel, docs/parallel.md):
 * before the fused kernel's op, an op making the buffers its call holds —
 * every rank's keys and values all-gathered, the merge's fp32 output and
 * its update's temporaries (four), one step's output — and its index
 * (MLG_NONE without a ring); after it, the op dropping them. */
uint16_t ml__kit_ring_open(ml_graph *g, bool ring);
void ml__kit_ring_close(ml_graph *g, uint16_t open);
uint16_t ml__kit_scores(ml_graph *g, const char *name, uint8_t dtype, uint8_t flags);
/* HF's rotate-half rotary (apply_rotary_pos_emb) on the head tensor x of
 * hd heads, node by node in backward; its products with cos and sin, and
 * the rotated heads, in dtype class dt (MLG_STREAM under rot_fp32, else
 * MLG_COMPUTE); pass (Phi-3's and GPT-NeoX's fused projections): the op
 * of x's pass (ml__kit_rope_pass, made before; else NULL), the rotated
 * heads cat with it into a new tensor, whose gradient the pass's node
 * frees. Returns the rotated heads (kit_rope.c). */
uint16_t ml__kit_rope(ml_graph *g, uint16_t x, uint8_t hd, uint8_t dt, mlg_op *pass);
/* The empty pass of x (Phi-3's, GPT-NeoX's), its node named node: before q's and k's
 * rotaries (kit_rope.c); its op, for ml__kit_rope. */
mlg_op *ml__kit_rope_pass(ml_graph *g, uint16_t x, const char *node);
/* The q k^T matmul of q's operand qb and k's kb (MLG_NONE: qb holds both,
 * nanoGPT's copies) into the scores S, saving both (the attention core's
 * FLOPs); returns its op (the caller frees its copies there). */
mlg_op *ml__kit_qk(ml_graph *g, uint16_t qb, uint16_t kb, uint16_t S);
/* * scaling (a Python number: nothing saved) of the scores S; S goes. */
uint16_t ml__kit_scale(ml_graph *g, uint16_t S);
/* The same in place (`scores /= math.sqrt(head_dim)`: FalconAttention's):
 * no tensor made, the scaled scores a view of S's storage; DivBackward0
 * makes S's gradient from theirs. */
uint16_t ml__kit_scale_inplace(ml_graph *g, uint16_t S);
/* The probabilities P cast to the compute dtype for the PV matmul (which
 * saves the copy; ToCopyBackward0 saves nothing); P's reference goes. */
uint16_t ml__kit_probs_cast(ml_graph *g, uint16_t P);
/* The same copy, P's reference kept (the caller drops it). */
uint16_t ml__kit_probs_copy(ml_graph *g, uint16_t P);
/* The PV matmul: the probabilities times v's operand vb (both saved; vc:
 * a contiguous copy whose reference goes once it has run, or MLG_NONE);
 * returns the (B, H, T, dh) product. */
uint16_t ml__kit_pv(ml_graph *g, uint16_t probs, uint16_t vb, uint16_t vc);
/* Autocast's copy of the (B, h, T, dh) heads x in the compute dtype
 * (ToCopyBackward0: x's gradient in x's dtype from the copy's). */
uint16_t ml__kit_autocast_copy(ml_graph *g, uint16_t x, uint8_t h, const char *name);
/* The same on autocast's copy Pc of the probabilities (ml__kit_probs_copy),
 * which goes with vc once the product has run (bmm saves it; the
 * probabilities stay bound). */
uint16_t ml__kit_pv_cast(ml_graph *g, uint16_t Pc, uint16_t vb, uint16_t vc);
/* The same product into the caller's output O, its heads d wide (latent
 * attention's values: MLG_DV); returns its op. */
mlg_op *ml__kit_pv_into(ml_graph *g, uint16_t probs, uint16_t vb, uint16_t O, uint8_t d);
/* An op of x into y whose node (node) makes x's gradient and frees none
 * of y's (the composites whose nodes the graph does not follow one by one:
 * T5's layers, gelu_new). */
mlg_op *ml__kit_grad_step(ml_graph *g, uint8_t kind, const char *name, uint16_t x, uint16_t y,
                          const char *node);
/* transformers' gelu_new of x (B, T, F), x's reference dropped: its
 * tensors declared, then its ops (kit_gelu.c); the output, named name, in
 * the compute dtype, fp32 under autocast (whose pow runs in fp32 on a copy
 * of x). With nodes, its backward node by node (without autocast); else
 * nodes that make their input's gradient alone (a block-level backward:
 * the caller drops the node list). */
uint16_t ml__kit_gelu_new(ml_graph *g, bool autocast, uint16_t x, const char *name, bool nodes);
/* scaled_dot_product_attention's math kernel on the rotated q (qr,
 * contiguous or not), k (kr) and v (vh) heads, is_causal with grouped
 * heads (enable_gqa), in fp32 (aten/src/ATen/native/transformers/
 * attention.cpp, _scaled_dot_product_attention_math and _safe_softmax:
 * docs/inventory.md); returns its (B, H, T, dh) output, the probabilities
 * dropped as it returns. */
uint16_t ml__kit_sdpa_math(ml_graph *g, const mlg_layer *L, uint16_t qr, uint16_t kr,
                           uint16_t vh, bool q_contiguous);
/* y = x.transpose(1, 2).contiguous() of the attention output O (its node:
 * eager only; f[0 .. nf): references that go with O, each storage once),
 * then the output projection and the residual dropout; returns the branch
 * output, *Oc the projection's input. */
uint16_t ml__kit_attention_out(ml_graph *g, const mlg_layer *L, uint16_t O, const uint16_t *f,
                               unsigned nf, uint16_t *Oc);
/* q, k and v of HF's attention: the projections' outputs (q, k, v: views
 * of one output when fused) and their head views; bound, a tensor the
 * caller holds until the attention returns (Falcon's fused_qkv; MLG_NONE:
 * none). */
typedef struct {
    uint16_t q, k, v, qh, kh, vh, bound;
} mlg_qkv;
/* Phi-3's qkv_proj on h and the q, k, v slices' head views (kit_phi3.c). */
mlg_qkv ml__kit_phi3_projection(ml_graph *g, const mlg_layer *L, uint16_t h);
/* Phi3MLP on h (kit_phi3.c): gate_up_proj chunked, up * act(gate), down. */
uint16_t ml__kit_phi3_mlp(ml_graph *g, const mlg_layer *L, uint16_t h);
/* The group of a layer's component (MLG_GROUP_*) in the order its
 * modules register their parameters. */
uint8_t ml__kit_group(const mlg_layer *L, unsigned component);
/* HF's eager attention on h (kit_hf.c): its branch output; *held the
 * weights it returns and *k, *v what the cache keeps (MLG_NONE: none),
 * which the layer drops as it returns. */
uint16_t ml__kit_hf_attention(ml_graph *g, const mlg_layer *L, uint16_t h, uint16_t *held,
                              uint16_t *k, uint16_t *v);
/* HF's attention (kit_hf.c) on heads already projected (p): the rotary,
 * the eager core or a fused kernel, the output projection; as
 * ml__kit_hf_attention. */
uint16_t ml__kit_hf_attention_on(ml_graph *g, const mlg_layer *L, const mlg_qkv *p,
                                 uint16_t *held, uint16_t *k, uint16_t *v);
/* Falcon's _split_heads index lists (kit_falcon.c): with one key/value
 * head (a->grouped) k and v are picked with fused_qkv[..., [-2], :] and
 * [..., [-1], :], each list a one-element int64 tensor that
 * IndexBackward0 saves (`kept`); declared here, made by the index op.
 * Both MLG_NONE otherwise. */
void ml__kit_falcon_lists(ml_graph *g, const mlg_attention *a, uint16_t lists[2]);
/* FalconAttention on h (kit_falcon.c): query_key_value and _split_heads
 * (k and v picked with lists, ml__kit_falcon_lists), then HF's attention
 * on the heads; as ml__kit_hf_attention. */
uint16_t ml__kit_falcon_attention(ml_graph *g, const mlg_layer *L, uint16_t h,
                                  const uint16_t lists[2], uint16_t *held, uint16_t *k,
                                  uint16_t *v);
/* DeepSeek's multi-head latent attention on h (kit_mla.c): its branch
 * output. */
uint16_t ml__kit_mla_attention(ml_graph *g, const mlg_layer *L, uint16_t h);
/* DeepSeek's mixture-of-experts MLP on h (kit_moe.c): L->moe's router,
 * routed experts and shared experts; returns the routed experts' output. */
uint16_t ml__kit_moe(ml_graph *g, const mlg_layer *L, uint16_t h);
/* Mixtral's and Qwen2-MoE's sparse MoE block on h (kit_mixtral.c): the
 * router, each expert with rows on its rows (the graph's repeated group),
 * Qwen2-MoE's gated shared expert; returns the block's output. */
uint16_t ml__kit_mixtral_moe(ml_graph *g, const mlg_layer *L, uint16_t h);
/* HF LlamaRMSNorm of x (kit_hf.c). */
uint16_t ml__kit_rmsnorm(ml_graph *g, const mlg_norm *n, uint16_t x, bool xbuf);
/* ... of a (B, T, width) x, its output (weight * h) in dtype: the wider
 * of the parameters' and x's (DeepSeek's latent norms: the stream's). */
uint16_t ml__kit_rmsnorm_of(ml_graph *g, const mlg_norm *n, uint16_t x, bool xbuf, uint8_t width,
                            uint8_t dtype);
/* HF GemmaRMSNorm of x (kit_hf.c). */
uint16_t ml__kit_gemma_norm(ml_graph *g, const mlg_norm *n, uint16_t x, bool xbuf);
/* HF OlmoLayerNorm of x (kit_hf.c). */
uint16_t ml__kit_olmo_norm(ml_graph *g, const mlg_norm *n, uint16_t x, bool xbuf);
/* HF LlamaMLP's gated MLP on h (kit_hf.c): down(act(gate(h)) * up(h)). */
uint16_t ml__kit_glu_mlp(ml_graph *g, const mlg_layer *L, uint16_t h);
/* HF CLIPMLP with QuickGELU on h (kit_clip.c): fc2(fc1(h) * sigmoid(1.702
 * fc1(h))). */
uint16_t ml__kit_quick_gelu_mlp(ml_graph *g, const mlg_layer *L, uint16_t h);

/* A norm of the residual stream x (whose gradient buffer the skip already
 * holds: xbuf); returns its output. */
uint16_t ml__kit_norm(ml_graph *g, const mlg_norm *n, uint16_t x, bool xbuf);
/* A LayerNorm's statistics (mean and rstd, fp32 per row), declared apart
 * from the norm (ml__kit_layernorm): a composition may declare tensors
 * between them and the output, the order the inventory lists them in
 * (Falcon's index lists). */
uint16_t ml__kit_layernorm_stats(ml_graph *g);
/* LayerNorm (n->kind MLG_LAYERNORM) of x with the statistics st. */
uint16_t ml__kit_layernorm(ml_graph *g, const mlg_norm *n, uint16_t x, bool xbuf, uint16_t st);
/* nn.Dropout on x when p > 0: returns its output (x when there is none);
 * held: the output's gradient is a buffer another op holds. */
uint16_t ml__kit_dropout(ml_graph *g, bool on, uint16_t x, const char *node, bool core,
                         bool held);
/* Gemma 2's soft cap of x (the scores, attention: true; or the logits):
 * x / cap, tanh (which saves its result), * cap, each a new tensor of x's
 * shape; dividing and multiplying by a Python float keep only a host
 * scalar. Frees x; returns the product. */
uint16_t ml__kit_softcap(ml_graph *g, uint16_t x, bool attention);
/* HF eager attention's softmax of the (masked, scaled) scores S3 and the
 * dropout on the probabilities (kit_softmax.c): softmax(dtype=fp32), fp16
 * converting inside the kernel, bf16 copied to fp32 first (aten's
 * SoftMax.cpp, the copy's ToCopyBackward0 casting the gradient back), its
 * fp32 result saved and cast back to the compute dtype for the PV matmul
 * (the scores rebound once that cast is made); BERT's and Falcon's in the
 * stream's dtype. Returns the probabilities the PV matmul reads. */
uint16_t ml__kit_hf_softmax(ml_graph *g, const mlg_layer *L, uint16_t S3);
/* x + y into the residual stream; frees y. */
uint16_t ml__kit_residual(ml_graph *g, uint16_t x, uint16_t y);
/* The same for a layer's residual sum (its autocast's cast of the branch's
 * gradient); keep: y stays bound (the caller frees it). */
uint16_t ml__kit_layer_residual(ml_graph *g, const mlg_layer *L, uint16_t x, uint16_t y,
                               bool keep);
/* Self-attention on h; returns its branch output (before the residual). */
uint16_t ml__kit_attention(ml_graph *g, const mlg_layer *L, uint16_t h);
/* The MLP on h; returns its branch output (keep_act: the activation's output
 * is the layer's to drop, given in *kept). */
uint16_t ml__kit_mlp(ml_graph *g, const mlg_layer *L, uint16_t h, uint16_t *kept);
/* x + y, a new tensor of x's dtype; neither reference goes. */
uint16_t ml__kit_add(ml_graph *g, uint16_t x, uint16_t y);
/* Frees each storage of t[0 .. n) once (MLG_NONE: skipped), after op o. */
void ml__kit_free_storages(ml_graph *g, mlg_op *o, const uint16_t *t, unsigned n);

/* A pre-norm layer: x + attn(norm(x)), then + mlp(norm(.)); returns its
 * output (MLG_NONE: L is GPT-NeoX's, Falcon's or BERT's layout, which
 * name none). */
uint16_t ml__kit_prenorm_layer(ml_graph *g, const mlg_layer *L);
/* A decoder's head: the final norm (L->norm) and the LM head over the
 * vocabulary, its (V, D) weight the embeddings' when tied; its output the
 * logits the loss reads (softcap: Gemma 2's logits / cap, tanh, * cap).
 * fused: the norm alone, whose output the fused linear cross-entropy reads
 * (training.logits: fused). */
void ml__kit_lm_head(ml_graph *g, const mlg_layer *L, bool tied, bool fused, bool softcap);

#endif
