/* Internal view of a loaded model, shared by the loader and the ledger. */
#ifndef ML_MODEL_INTERNAL_H
#define ML_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "memledger/model.h"

/* encdec: T5's encoder-decoder (HF T5ForConditionalGeneration): layers encoder
 * blocks, dec_layers decoder blocks with cross-attention, relative position
 * biases (docs/inventory.md, "T5") */
typedef enum {
    ML_MODEL_DECODER,
    ML_MODEL_ENCODER,
    ML_MODEL_SEQUENTIAL,
    ML_MODEL_ENCDEC
} ml_model_type;
/* swiglu: down(silu(gate(x)) * up(x)) (Llama); geglu: the same gated MLP with
 * GELU, exact or tanh-approximated (Gemma): one op that saves its input
 * either way (docs/inventory.md) */
/* quick_gelu: x * sigmoid(1.702 * x) (CLIP's vision MLP, HF QuickGELUActivation) */
typedef enum { ML_ACT_GELU, ML_ACT_RELU, ML_ACT_SWIGLU, ML_ACT_GEGLU, ML_ACT_QUICK_GELU } ml_activation;
/* rmsnorm: HF LlamaRMSNorm, weight * h.to(dtype); gemma_rmsnorm: HF
 * GemmaRMSNorm, (h * (1 + weight)) in fp32, then cast; olmo_layernorm: HF
 * OlmoLayerNorm, a LayerNorm without weight or bias in fp32, then cast
 * (docs/inventory.md) */
typedef enum {
    ML_NORM_LAYERNORM,
    ML_NORM_RMSNORM,
    ML_NORM_GEMMA_RMSNORM,
    ML_NORM_OLMO_LAYERNORM
} ml_norm;
typedef enum { ML_POS_LEARNED, ML_POS_ROPE, ML_POS_NONE } ml_position;
/* eager: the matmul/softmax layout; flash: a fused kernel's inventory;
 * sdpa: scaled_dot_product_attention as PyTorch dispatches it (a fused
 * kernel, or the math kernel where none accepts the inputs) */
typedef enum { ML_ATTN_EAGER, ML_ATTN_FLASH, ML_ATTN_SDPA } ml_attention;
typedef enum { ML_LOSS_CROSS_ENTROPY, ML_LOSS_MSE } ml_loss;

typedef enum {
    ML_L_LINEAR,
    ML_L_CONV2D,
    ML_L_BATCHNORM,
    ML_L_LAYERNORM,
    ML_L_RELU,
    ML_L_GELU,
    ML_L_SILU,
    ML_L_DROPOUT,
    ML_L_MAXPOOL,
    ML_L_AVGPOOL,
    ML_L_FLATTEN,
    ML_L_RESIDUAL,
    ML_L_EMBEDDING,
    ML_L_ATTENTION,
    ML_L_KIND_COUNT
} ml_layer_kind;

typedef struct ml_layer ml_layer;
struct ml_layer {
    ml_layer_kind kind;
    unsigned line, col;      /* position in the file, for messages */
    uint64_t out;            /* linear/conv2d: output features/channels */
    uint64_t kernel, stride, padding;
    uint64_t vocab, dim;     /* embedding */
    uint64_t heads;          /* attention */
    bool bias;
    bool global;             /* avgpool */
    bool inplace;            /* relu: nn.ReLU(inplace=True), its result in its input's
                                storage */
    bool causal;             /* attention */
    double p;                /* dropout */
    ml_layer *body;          /* residual */
    size_t nbody;
    ml_layer *shortcut;      /* residual: NULL/0 = identity */
    size_t nshortcut;
};

/* A model is its components (docs/cli.md, "The model file"): a
 * transformer layer is a norm, an attention, an MLP (or a mixture of
 * experts) and the residual that joins them; around the layers, the
 * embedding and the head; T5's stacks and LLaVA's vision tower add theirs.
 * The op graph's families (src/graph/families.c) compose a layer from
 * these. */

/* The layers' normalisations. */
typedef struct {
    ml_norm kind;
    bool bias; /* the LayerNorms have a bias (default: model.bias; HF
                  Falcon's LayerNorms keep theirs while its projections
                  have none) */
} ml_norm_spec;

/* The self-attention. */
typedef struct {
    uint64_t heads, kv_heads;
    uint64_t head_dim;      /* the head size (HF head_dim): q projects D -> heads * head_dim,
                               k and v D -> kv_heads * head_dim; default hidden / heads */
    bool qkv_bias;          /* biases on the q/k/v projections (default: bias) */
    bool out_bias;          /* a bias on the output projection even without `bias` (HF
                               Llama's attention_bias) */
    uint64_t sliding_window; /* HF sliding_window: a longer planned sequence is refused
                                (the window is not modelled); 0 = none */
    bool fused_softmax;      /* Megatron's scaled upper-triangular masked softmax
                                (megatron/core/fusions/fused_softmax.py): the causal
                                mask made inside the kernel, nothing saved for it; set
                                for training.engine: megatron (chain.c) */
    bool fused_proj;         /* one qkv_proj (and the MLP's one gate_up_proj) whose outputs
                                are sliced and chunked (HF Phi-3; docs/inventory.md, "Phi-3
                                block") */
    double scalar;           /* the scores are scaled by scalar^-0.5 (HF
                                query_pre_attn_scalar); 0 = head_dim: a value, not a size */
    double softcap;          /* scores / cap, tanh, * cap before the mask (HF
                                attn_logit_softcapping); 0 = none */
    ml_attention kernel;     /* eager, sdpa or flash */
    const char *kernel_assumed; /* why, when the input names no kernel (a Hugging Face
                                   config.json without attn_implementation): a static
                                   string; NULL when the input or the command line
                                   chose it */
    bool kv_cache;              /* the forward returns every layer's keys and values (HF
                                   use_cache, on by default for decoders) */
    /* multi-head latent attention (HF DeepseekV3Attention), on when kv_lora > 0: k and
       v from a kv_lora-wide compressed projection (kv_a_proj_with_mqa, RMSNorm,
       kv_b_proj), q directly (q_lora 0: q_proj) or through a q_lora-wide one; the q/k
       heads are head_dim wide, of which rope_dim rotate (one rotated key part shared by
       every head), the value heads v_dim */
    uint64_t kv_lora, q_lora, rope_dim, v_dim;
} ml_attention_spec;

/* The dense MLP. */
typedef struct {
    uint64_t ffn;
    ml_activation activation;
    bool bias; /* biases on the projections even without `bias` (HF Llama's
                  mlp_bias) */
    bool gelu_new; /* with ML_ACT_GELU: transformers' gelu_new, a composite of
                      elementwise ops that saves three (B, T, F) tensors more
                      than the one op (HF GPT-2's and Phi-2's default) */
} ml_mlp_spec;

/* A mixture of experts in place of the dense MLP (experts > 0). */
typedef struct {
    uint64_t experts;       /* SwiGLU experts (HF Mixtral's num_local_experts) */
    uint64_t per_token;     /* the experts each token is routed to (top-k) */
    uint64_t expert_ffn;    /* each expert's width (HF moe_intermediate_size); 0 = ffn */
    uint64_t shared_ffn;    /* a shared expert on every token (HF Qwen2-MoE's
                               shared_expert_intermediate_size); 0 = none */
    bool renorm;            /* the top-k weights renormalised to sum to 1 (Mixtral; HF
                               norm_topk_prob) */
    bool shared_gate;       /* the shared expert's output scaled by a sigmoid gate
                               (Qwen2-MoE; DeepSeek-V3's shared experts have none) */
    bool router_sigmoid;    /* DeepSeek-V3's router: sigmoid scores, the top-k gathered
                               from them (HF DeepseekV3TopkRouter); else Mixtral's softmax */
    bool sort;              /* DeepSeek-V2's dispatch (HF DeepseekV2MoE.moe): the (token,
                               expert) pairs sorted by expert, the experts on slices, the
                               outputs scattered back, weighted and summed in fp32; else
                               Mixtral's torch.where per expert */
    bool grouped_topk;      /* DeepSeek-V2's group_limited_greedy: the scores outside the
                               chosen groups masked (masked_fill keeps the bool mask) */
    uint64_t dense_layers;  /* the first dense_layers layers run one dense MLP of ffn
                               instead of the experts (HF first_k_dense_replace) */
} ml_moe_spec;

/* How the norms, the attention and the MLP are joined. */
typedef struct {
    bool prenorm;
    bool parallel;          /* x + attn(ln1(x)) + mlp(ln2(x)) (GPT-NeoX, GPT-J) */
    bool shared_norm;       /* with parallel: one norm feeds both branches,
                               x + attn(ln(x)) + mlp(ln(x)) (HF Falcon's input_layernorm) */
    bool post_norms;        /* Gemma 2's layer: a norm on the attention's and on the MLP's
                               output before each residual add (four per layer) */
} ml_residual_spec;

/* The embedding. */
typedef struct {
    uint64_t vocab, max_positions, token_types;
    ml_position position;
    bool tied;         /* the LM head's weight is the token embeddings' */
    bool scale;        /* the embeddings are multiplied by sqrt(hidden) (Gemma's
                          normalizer, a 0-dim host tensor: saves nothing on the
                          device) */
    bool rope_complex; /* DeepSeek-V2's rotary as a complex product (apply_rotary_emb):
                          one complex64 table instead of cos and sin */
    bool vocab_parallel; /* Megatron-LM's VocabParallelEmbedding (tensor parallelism
                            above 1; ledger/tensor_parallel.c sets it on the rank's
                            model): the rank's rows, its ids masked and shifted */
    uint64_t image_size, patch_size, channels; /* a vision encoder's patches (ViT) */
} ml_embedding_spec;

/* The head. */
typedef struct {
    uint64_t classes; /* encoder classifier; a decoder's classes: the
                         sequence-classification head (HF *ForSequenceClassification) */
    bool cls_no_pad;  /* that head without pad_token_id: each sequence's last token
                         by position, which transformers refuses above one sample */
    bool pooler;
    bool mlm;             /* an encoder's masked-LM head over the vocabulary instead of
                             the classifier (HF BertForMaskedLM) */
    double final_softcap; /* the LM logits soft-capped (HF final_logit_softcapping);
                             0 = none */
    bool vocab_parallel_ce; /* Megatron-LM's vocab-parallel cross-entropy instead
                               of F.cross_entropy (engine megatron, or tensor
                               parallelism above 1; ledger/tensor_parallel.c sets
                               it on the rank's model) */
    bool targets_held;      /* with it, the loop holds the targets all iteration
                               (eager PyTorch's loop: its batch), which the
                               cross-entropy does not save (a masked clone) */
} ml_head_spec;

/* T5 (type encdec): the decoder's blocks, the relative position buckets (HF
 * relative_attention_num_buckets) and the distance they reach
 * (relative_attention_max_distance: a value, not a size). */
typedef struct {
    uint64_t dec_layers, rel_buckets, rel_max_distance;
} ml_t5_spec;

/* A multimodal decoder's vision tower (HF LlavaForConditionalGeneration, on
 * when layers > 0): a CLIP tower of `layers` pre-norm layers (hidden wide,
 * the attention's heads, an MLP of ffn, quick_gelu or gelu) over `image` square
 * images cut in `patch` patches of `channels` channels; the projector
 * (linear, gelu, linear; proj_bias) reads the output of its first `used`
 * layers (HF vision_feature_layer), the class token dropped unless full
 * (vision_feature_select_strategy: full); the later layers run, their
 * output unused (docs/inventory.md, "Llava"). */
typedef struct {
    uint64_t layers, hidden;
    ml_attention_spec attn; /* heads: CLIP's attention (biased, eager) */
    ml_mlp_spec mlp;        /* ffn; activation: quick_gelu or gelu */
    uint64_t image, patch, channels;
    uint64_t used;
    bool full, proj_bias;
} ml_vision_spec;

/* Where the file set a configuration key ("training.micro_batch",
 * "parallel.tp", "device.memory"; the compact "parallel" word as itself),
 * for messages about it that come after loading (ml_model_key_position). */
typedef struct {
    char key[40];
    unsigned line, col;
} ml_keypos;
#define ML_KEYPOS_MAX 64

struct ml_model {
    char name[128];
    ml_model_type type;
    /* transformer shorthand */
    uint64_t layers, hidden;
    bool bias; /* the projections' biases (the components' defaults) */
    double dropout;
    ml_norm_spec norms;
    ml_attention_spec attn;
    ml_mlp_spec mlp;
    ml_moe_spec moe;
    ml_residual_spec residual;
    ml_embedding_spec embed;
    ml_head_spec head;
    ml_t5_spec t5;
    ml_vision_spec vision;
    uint64_t buffers; /* module buffers the YAML declares (model.buffers, bytes),
                         beside those the layers imply */
    /* sequential */
    ml_layer *seq;
    size_t nseq;
    uint64_t input[4];
    size_t ninput;
    ml_loss loss;
    /* settings */
    ml_config config;
    ml_keypos keypos[ML_KEYPOS_MAX]; /* the configuration keys the file set */
    size_t nkeypos;
};

/* The devices a plan's layout takes: tp x pp x cp x dp, each at least 1
 * (parallel.c). */
uint64_t ml__training_devices(const ml_training *t);
void ml__layers_free(ml_layer *layers, size_t n);
/* "linear", "conv2d", ...: the YAML name of a layer kind (schema_layers.c). */
const char *ml__layer_kind_name(ml_layer_kind k);

/* Limits of the model file that keep every product representable
 * (docs/ledger.md, "robustness"). */
#define ML_MAX_LAYERS 100000ull
#define ML_MAX_HIDDEN (1ull << 20)
#define ML_MAX_FFN (1ull << 24)
#define ML_MAX_VOCAB (1ull << 28)
#define ML_MAX_TOKENS (1ull << 28)
#define ML_MAX_BATCH (1ull << 24)

/* How the Hugging Face import treats each config.json key (hf.c; the table
 * of docs/hf.md is generated from it and checked by tests/unit/test_hf.c). */
typedef enum {
    ML_HF_HONOURED,      /* read into the model (values it cannot model are refused) */
    ML_HF_INERT,         /* changes nothing the planner computes; note says why */
    ML_HF_APPROXIMATED,  /* planned approximately; note says how */
    ML_HF_REFUSED_UNLESS /* refused unless its value is one of ok (or, ok NULL, as noted) */
} ml_hf_use;

enum {
    ML_HF_LLAMA = 1u << 0,
    ML_HF_MISTRAL = 1u << 1,
    ML_HF_QWEN2 = 1u << 2,
    ML_HF_GPT2 = 1u << 3,
    ML_HF_NEOX = 1u << 4,
    ML_HF_BERT = 1u << 5,
    ML_HF_VIT = 1u << 6,
    ML_HF_GEMMA = 1u << 7,
    ML_HF_PHI3 = 1u << 8,
    ML_HF_GEMMA2 = 1u << 9,
    ML_HF_FALCON = 1u << 10,
    ML_HF_MIXTRAL = 1u << 11,
    ML_HF_QWEN2MOE = 1u << 12,
    ML_HF_DEEPSEEK3 = 1u << 13,
    ML_HF_DEEPSEEK2 = 1u << 14,
    ML_HF_T5 = 1u << 15,
    ML_HF_MT5 = 1u << 16,
    ML_HF_LLAVA = 1u << 17,
    ML_HF_CLIPV = 1u << 18, /* clip_vision_model: a llava's vision_config only */
    ML_HF_OLMO = 1u << 19,
    ML_HF_FAMILY_COUNT = 20
};
#define ML_HF_LM3                                                                       \
    (ML_HF_LLAMA | ML_HF_MISTRAL | ML_HF_QWEN2 | ML_HF_MIXTRAL | ML_HF_QWEN2MOE |        \
     ML_HF_OLMO) /* the Llama-layout families */
#define ML_HF_SUPPORTED \
    "llama, mistral, mixtral, qwen2, qwen2_moe, deepseek_v2, deepseek_v3, gemma, gemma2, phi3, " \
    "gpt2, gpt_neox, falcon, bert, vit, t5, mt5, llava, olmo"

/* A family: its model_type, its bit, the class it is planned as and that
 * class's head, and a second class the planner builds too (NULL: none;
 * BERT's BertForMaskedLM) with its head (hf_keys.c); its configuration
 * class and that class's defaults for the sizes a config.json may leave
 * out: intermediate_size, num_key_value_heads, head_dim (0: the class's
 * default is None, or it has no such key: 4 · hidden_size,
 * num_attention_heads, hidden_size / num_attention_heads; hf_families.c). */
typedef struct {
    const char *type;
    unsigned bit;
    const char *arch;
    const char *head;
    const char *arch2;
    const char *head2;
    const char *config;
    uint64_t ffn, kv_heads, head_dim;
} ml_hf_family_info;
/* ML_HF_FAMILY_COUNT entries. */
const ml_hf_family_info *ml__hf_families(void);

typedef struct {
    const char *key;
    unsigned families; /* ML_HF_* bits */
    ml_hf_use use;
    const char *ok;    /* ML_HF_REFUSED_UNLESS: the accepted values as JSON literals,
                          separated by '|' ("{}" an empty object); NULL: checked by the
                          loader against other keys, as the note says */
    const char *note;  /* what is honoured, why inert, or why refused */
} ml_hf_key;

/* The key table (all families), in the order docs/hf.md lists it. */
const ml_hf_key *ml__hf_keys(size_t *count);
/* The ML_HF_* bit of a model_type ("llama", "gpt_neox", ...), 0 when unsupported. */
unsigned ml__hf_family(const char *model_type);
/* Why the planner refuses a model_type transformers has (the layer feature
 * not expressed); NULL for the others (hf_families.c). */
const char *ml__hf_refused_family(const char *model_type);
/* The model_type of one ML_HF_* bit. */
const char *ml__hf_family_name(unsigned bit);
/* The entry for key in a family (one ML_HF_* bit), or NULL: the key is refused. */
const ml_hf_key *ml__hf_key_find(unsigned family, const char *key);

/* Reads a YAML document holding only training: and device: sections (and an
 * optional name:) into m->config (schema.c). */
ml_status ml__schema_settings(const char *text, size_t len, const char *path, ml_model *m,
                              ml_error *err);

/* DeepSpeed's ZeRO bucket sizes where nothing uses them (t without ZeRO):
 * the key `given` (a flag's or a job's, NULL: none) or else one the model
 * file set, refused with a message that begins with the key (located by
 * the caller, ml_model_locate_error); ML_OK when used or not set. */
ml_status ml__model_check_buckets(const ml_model *m, const ml_training *t, const char *given,
                                  ml_error *err);

/* d without the allocator's simulation: the allocated view a search
 * plans first (fit, compare, lengths, layouts). The simulation's own
 * settings go with it (a split size beside no simulation is refused:
 * ml_config_problem). */
static inline void ml__device_allocated_view(ml_device *d)
{
    d->allocator = ML_ALLOCATOR_NONE;
    d->max_split_size = 0;
}

#endif
