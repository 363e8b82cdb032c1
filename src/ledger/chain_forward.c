/* A transformer layer's forward, op by op (docs/ledger.md, "The forward,
 * op by op"): what the layer holds while it runs, with grad (the saved
 * tensors stay) and under no_grad (a checkpointed layer's first forward,
 * the evaluation pass: nothing stays). A tensor lives from the op that
 * makes it until its last Python reference goes — the program follows the
 * reference implementations' own variable scoping (nanoGPT's Block,
 * CausalSelfAttention and MLP; Hugging Face's LlamaDecoderLayer,
 * LlamaAttention with eager_attention_forward, LlamaMLP, Phi3MLP and
 * Gemma2DecoderLayer; BertLayer with BertSelfAttention, BertSelfOutput,
 * BertIntermediate and BertOutput) and the copies ATen makes (matmul
 * reshapes a head view it cannot fold into bmm's batch into a contiguous
 * copy, aten/src/ATen/native/LinearAlgebra.cpp) — or, with grad, until the
 * backward when autograd saves it (tools/autograd/derivatives.yaml; the
 * inventory of docs/inventory.md, which the program's end must reproduce). */
#include <string.h>

#include "ledger/chain_kit.h"

/* The sizes the programs use, in bytes. */
typedef struct {
    ml_ck_ng g;
    bool grad;       /* with grad: saved tensors stay */
    bool drop;       /* the dropouts run (p > 0, training mode) */
    bool fp16;       /* the 2-byte dtype is float16 (else bfloat16) */
    bool keeps_in;   /* the norms save their input (LayerNorm; an RMSNorm on an
                        fp32 stream): else an RMSNorm saves its fp32 copy */
    uint64_t later;  /* kept past the attention's return (a KV cache), freed
                        at the layer's end */
    uint64_t E;      /* (B, T, D), the residual stream's dtype */
    uint64_t E32;    /* (B, T, D) in fp32: an RMSNorm's upcast */
    uint64_t st;     /* (B, T) fp32: a norm's statistics */
    uint64_t Eq, Ek; /* q (B, T, H * dh) and k, v (B, T, Hkv * dh) */
    uint64_t S, S32; /* the scores (B, H, T, T) in the compute dtype, in fp32 */
    uint64_t Sb;     /* the scores' shape in bytes: a dropout mask */
    uint64_t EF;     /* (B, T, F) */
    uint64_t Eb;     /* (B, T, D) bytes: a residual dropout mask */
    uint64_t TT;     /* (T, T) bool: masked_fill's mask */
    uint64_t Dw;     /* (D) fp32: Gemma's 1 + weight */
} prog;

static void put(prog *p, uint64_t b) { ml_ck_ng_put(&p->g, b); }
/* A tensor's last reference goes: freed unless autograd saved it. */
static void drop(prog *p, uint64_t b) { ml_ck_ng_drop(&p->g, b); }
static void drop_saved(prog *p, uint64_t b)
{
    if (!p->grad)
        ml_ck_ng_drop(&p->g, b);
}
static void drop_if(prog *p, uint64_t b, bool saved)
{
    if (saved)
        drop_saved(p, b);
    else
        drop(p, b);
}

/* A dropout on a tensor of x bytes (native_dropout: its output and the
 * mask it saves), then its input's reference goes; in_saved: another op
 * saved the input. */
static void dropout(prog *p, uint64_t x, uint64_t mask, bool in_saved)
{
    if (!p->drop)
        return;
    put(p, x);
    put(p, mask);
    drop_saved(p, mask);
    drop_if(p, x, in_saved);
}

/* LayerNorm: native_layer_norm's output, mean and rstd (saved with its
 * input). */
static void layernorm(prog *p)
{
    put(p, p->E);
    put(p, 2 * p->st);
    drop_saved(p, 2 * p->st);
}

/* An RMSNorm's start: x in fp32 (a copy when the stream is not fp32:
 * returns whether it is), x^2, its mean over the last dimension; the square
 * goes once the mean is made (2.x's mean keeps no input). */
static bool square_mean(prog *p)
{
    const bool up = p->E != p->E32;
    if (up)
        put(p, p->E32);
    put(p, p->E32); /* pow */
    put(p, p->st);  /* mean */
    drop(p, p->E32);
    return up;
}

/* HF LlamaRMSNorm: h = x.to(fp32); variance = h.pow(2).mean(-1); h = h *
 * rsqrt(variance + eps); return weight * h.to(x.dtype). Saved: x in fp32
 * (pow, the mul), rsqrt, the normalised h as the scale reads it. */
static void llama_rmsnorm(prog *p)
{
    const bool up = square_mean(p);
    put(p, p->st); /* + eps */
    put(p, p->st); /* rsqrt */
    drop(p, p->st);
    put(p, p->E32); /* h * rsqrt */
    drop_saved(p, p->st);
    if (up) {
        drop_saved(p, p->E32); /* the upcast, rebound */
        put(p, p->E);          /* h.to(dtype) */
    }
    put(p, p->E); /* weight * h */
    if (up) {
        drop_saved(p, p->E);
        drop(p, p->E32);
    } else {
        drop_saved(p, p->E32);
    }
    drop(p, p->st); /* variance, at return */
}

/* HF GemmaRMSNorm: out = _norm(x.float()) (x * rsqrt(x.pow(2).mean(-1) +
 * eps)); out = out * (1.0 + weight.float()); return out.type_as(x). Saved:
 * x in fp32, rsqrt, the normalised h and 1 + weight. */
static void gemma_rmsnorm(prog *p)
{
    const bool up = square_mean(p);
    put(p, p->st); /* + eps */
    drop(p, p->st);
    put(p, p->st);  /* rsqrt */
    drop(p, p->st);
    put(p, p->E32); /* x * rsqrt */
    drop_saved(p, p->st);
    if (up)
        drop_saved(p, p->E32); /* x.float(), once _norm returns */
    put(p, p->Dw);             /* 1.0 + weight.float() */
    put(p, p->E32);
    drop_saved(p, p->Dw + p->E32);
    if (up) {
        put(p, p->E); /* type_as */
        drop(p, p->E32);
    }
}

static void norm(prog *p, const ml_model *m)
{
    if (m->norms.kind == ML_NORM_LAYERNORM)
        layernorm(p);
    else if (m->norms.kind == ML_NORM_GEMMA_RMSNORM)
        gemma_rmsnorm(p);
    else
        llama_rmsnorm(p);
}

/* rotate-half rotary embedding of one (B, H, T, dh) tensor of x bytes:
 * (q * cos) + (cat(-q2, q1) * sin); leaves the result (the products save
 * cos and sin, which need no gradient: nothing of q). */
static void rope(prog *p, uint64_t x)
{
    put(p, x);     /* q * cos */
    put(p, x / 2); /* -q2 */
    put(p, x);     /* cat */
    drop(p, x / 2);
    put(p, x);     /* * sin */
    drop(p, x);    /* the cat */
    put(p, x);     /* the sum */
    drop(p, 2 * x);
}

/* The attention core after the projections, from q k^T to the
 * contiguous (B, T, H * dh) output; leaves it and the probabilities (the
 * last tensor bound to them, which the caller frees or keeps). copy_q,
 * copy_k, copy_v: the operands matmul copies (a head view whose reshape
 * into bmm's (B * H, T, dh) cannot be a view), which bmm saves; fp32: the
 * softmax runs in fp32 (dtype=torch.float32, then .to(dtype)); mask:
 * masked_fill's (T, T) bool (nanoGPT) or an additive mask (HF), none for
 * an encoder without one; keep_scores: the masked scores stay bound to
 * their own name (BertSelfAttention's attention_scores) until the
 * attention returns. */
typedef struct {
    bool copy_q, copy_k, copy_v, fp32, masked_fill, add_mask, softcap, keep_scores;
} core_kind;

static void attention_core(prog *p, const core_kind *k)
{
    const uint64_t S = p->S, Eq = p->Eq;
    const uint64_t cqk = (k->copy_q ? Eq : 0) + (k->copy_k ? Eq : 0);
    put(p, cqk);
    put(p, S); /* bmm: q k^T */
    drop_saved(p, cqk);
    put(p, S); /* * scaling (a Python number: nothing saved) */
    drop(p, S);
    if (k->softcap) { /* / cap, tanh (saves its result), * cap */
        put(p, S);
        drop(p, S);
        put(p, S);
        drop(p, S);
        put(p, S);
        drop_saved(p, S);
    }
    if (k->masked_fill) {
        put(p, p->TT); /* bias[:, :, :T, :T] == 0, saved by masked_fill */
        put(p, S);
        drop_saved(p, p->TT);
        drop(p, S);
    } else if (k->add_mask) {
        put(p, S);
        drop(p, S);
    }
    const uint64_t sm = k->fp32 ? p->S32 : S;
    /* softmax(x, dtype=float32): fp16 on CUDA converts inside the kernel
     * (half_to_float); bf16 is first copied to fp32 (aten's SoftMax.cpp,
     * softmax with a dtype) */
    const uint64_t conv = sm != S && !p->fp16 ? sm : 0;
    put(p, conv);
    put(p, sm); /* softmax: saves its result */
    drop(p, conv);
    if (!k->keep_scores)
        drop(p, S);
    if (sm != S) { /* .to(dtype), which the PV bmm saves */
        put(p, S);
        drop_saved(p, sm);
    }
    /* the dropout's input: the softmax result (saved), or its cast (not) */
    dropout(p, S, p->Sb, sm == S);
    const uint64_t cv = k->copy_v ? Eq : 0;
    put(p, cv);
    put(p, Eq); /* bmm: probabilities v (saves both) */
    drop_saved(p, cv);
    put(p, Eq); /* transpose(1, 2).contiguous(), the projection's input */
    drop(p, Eq);
}

/* The output projection and its residual dropout; the attention output it
 * read (saved by it) is rebound. Leaves the projection's (dropped) output. */
static void attention_out(prog *p)
{
    put(p, p->E);
    dropout(p, p->E, p->Eb, false);
    drop_saved(p, p->Eq);
}

/* A pre-norm layer's attention on its normed input (nanoGPT's
 * CausalSelfAttention; HF LlamaAttention, Phi3Attention, Gemma's). Leaves
 * its output; returns what the layer still holds after it: HF's eager
 * attention returns its weights, which the decoder layer's
 * `hidden_states, _ = self.self_attn(...)` keeps until it returns. */
static uint64_t prenorm_attention(prog *p, const ml_model *m, const ml_ck_dims *d)
{
    const bool hf = m->norms.kind != ML_NORM_LAYERNORM; /* the Llama layout */
    const bool rot = hf && m->embed.position == ML_POS_ROPE;
    const bool sliced = !hf || m->attn.fused_proj;    /* one projection, sliced */
    const bool cat = hf && m->attn.fused_proj && rot; /* Phi-3: cat([rotated, pass]) */
    const uint64_t rep = d->H / d->Hkv, Eq = p->Eq, Ek = p->Ek;
    const uint64_t qkv = Eq + 2 * Ek;
    if (sliced) {
        put(p, qkv);
    } else {
        put(p, Eq);
        put(p, Ek);
        put(p, Ek);
    }
    if (rot) {
        /* apply_rotary_pos_emb makes both; the caller's rebinding then
         * frees the unrotated q and k (Phi-3's are views of qkv) */
        rope(p, Eq);
        if (cat)
            put(p, Eq), drop(p, Eq);
        rope(p, Ek);
        if (cat)
            put(p, Ek), drop(p, Ek);
        if (!sliced)
            drop(p, Eq + Ek);
    }
    /* repeat_kv: k and v expanded to H heads and reshaped, copies bmm
     * saves, unless there is one kv head (then the reshape is a view with a
     * zero stride, which matmul copies instead) */
    const bool repeated = hf && rep > 1 && d->Hkv > 1;
    if (repeated)
        put(p, 2 * Eq);
    /* a rotated head keeps the view's layout; cat's and repeat_kv's
     * results are contiguous (bmm saves them themselves) */
    /* nanoGPT masks with masked_fill; HF adds its causal mask, and an
     * encoder's extended attention mask */
    const bool causal = m->type == ML_MODEL_DECODER;
    const core_kind k = {
        !cat,          !repeated && !(cat && rep == 1), !repeated,           hf,
        !hf && causal, hf ? causal : !causal,           m->attn.softcap > 0, false};
    attention_core(p, &k);
    if (repeated)
        drop_saved(p, 2 * Eq); /* eager_attention_forward returns */
    attention_out(p);
    /* the attention returns: q, k, v and the probabilities go, except the
     * weights HF returns (and what bmm saved: Phi-3's contiguous rotated q,
     * and k with one group) */
    /* in evaluation a KV cache keeps the rotated k and v (HF's
     * DynamicCache.update): they stay to the layer's end, where the replay
     * counts the cache */
    drop(p, qkv - p->later);
    if (cat) {
        drop_saved(p, Eq);
        drop_if(p, Ek, rep == 1);
    }
    if (hf)
        return p->S;
    drop_saved(p, p->S);
    return 0;
}

/* The MLP on its normed input (saved by its first projections); leaves its
 * (dropped) output. */
static void mlp(prog *p, const ml_model *m)
{
    const uint64_t EF = p->EF, E = p->E;
    if (m->mlp.activation == ML_ACT_SWIGLU || m->mlp.activation == ML_ACT_GEGLU) {
        if (m->attn.fused_proj) {
            /* Phi3MLP: gate, up = gate_up_proj(x).chunk(2); up = up * act(gate):
             * the activation saves the gate view, keeping the whole output */
            put(p, 2 * EF);
            put(p, EF); /* act(gate) */
            put(p, EF); /* up * act */
            drop_saved(p, EF);
            put(p, E);  /* down_proj */
            drop_saved(p, EF + 2 * EF); /* the product and gate_up's output, at return */
        } else {
            /* LlamaMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x)) */
            put(p, EF); /* gate */
            put(p, EF); /* act */
            drop_saved(p, EF);
            put(p, EF); /* up */
            put(p, EF); /* act * up */
            drop_saved(p, 2 * EF);
            put(p, E);  /* down */
            drop_saved(p, EF);
        }
    } else {
        /* nanoGPT's MLP: fc, act, proj, each saving its input (ReLU saves
         * its result instead) */
        put(p, EF);
        put(p, EF);
        drop_if(p, EF, m->mlp.activation != ML_ACT_RELU);
        put(p, E);
        drop_saved(p, EF);
    }
    dropout(p, E, p->Eb, false);
}

/* Pre-norm: x + attn(norm(x)), then + mlp(norm(.)); Gemma 2 normalises
 * each branch's output before its add (that norm saves its input). */
static void prenorm_layer(prog *p, const ml_model *m, const ml_ck_dims *d)
{
    const uint64_t E = p->E;
    const bool in = p->keeps_in;
    norm(p, m);
    uint64_t held = prenorm_attention(p, m, d);
    drop_saved(p, E); /* the norm's output, rebound */
    if (m->residual.post_norms) { /* a norm of the attention's output */
        norm(p, m);
        drop_if(p, E, in);
    }
    put(p, E); /* residual + attention, the second norm's input */
    drop(p, E);
    norm(p, m);
    mlp(p, m);
    drop_saved(p, E); /* the norm's output, rebound */
    if (m->residual.post_norms) {
        norm(p, m);
        drop_if(p, E, in);
    }
    put(p, E); /* residual + MLP: the layer's output */
    drop(p, E);
    drop_if(p, E, in);       /* the first residual sum, at return */
    drop_saved(p, held);     /* the weights */
    drop(p, p->later);       /* what the cache took over: the replay adds it */
}

/* HF BertLayer: BertSelfAttention (query, key, value; the scores and the
 * probabilities local to it), BertSelfOutput (dense, dropout,
 * LayerNorm(h + input)), then feed_forward_chunk: BertIntermediate (dense,
 * act), whose output it holds through BertOutput (dense, dropout,
 * LayerNorm(h + attention output)). */
static void postnorm_layer(prog *p, const ml_model *m)
{
    const uint64_t E = p->E, Eq = p->Eq, EF = p->EF;
    put(p, 3 * Eq); /* query, key, value: their head views are copied for bmm */
    const core_kind k = {true, true, true, false, false, true, false, true};
    attention_core(p, &k);
    drop(p, 3 * Eq + p->S); /* BertSelfAttention returns the context only */
    drop_saved(p, p->S);    /* the probabilities */
    put(p, E);              /* BertSelfOutput: dense */
    dropout(p, E, p->Eb, false);
    put(p, E); /* + input: LayerNorm's input */
    layernorm(p);
    drop_saved(p, E); /* the sum */
    drop(p, E);       /* the dropped dense output, rebound */
    drop_saved(p, Eq); /* the context, once BertAttention returns */
    put(p, EF);        /* BertIntermediate: dense */
    put(p, EF);        /* act (ReLU saves its result, not its input) */
    drop_if(p, EF, m->mlp.activation != ML_ACT_RELU);
    put(p, E); /* BertOutput: dense */
    dropout(p, E, p->Eb, false);
    put(p, E); /* + attention output */
    layernorm(p);
    drop_saved(p, E); /* the sum */
    drop(p, E);       /* the dropped dense output */
    drop_saved(p, EF + E); /* the intermediate output, the attention output, at return */
}

/* The head (HF LlamaForCausalLM, Gemma2ForCausalLM, nanoGPT's GPT): the
 * final norm, whose output the LM head saves, then the logits (L bytes),
 * soft-capped by Gemma 2 (/ cap, tanh: saves its result, * cap); with
 * logits: fused the norm only (the fused loss reads its output). HF
 * BertLMPredictionHead: dense, act, LayerNorm (each output the next op's
 * saved input, rebound), then the decoder. */
static void head(prog *p, const ml_model *m, const ml_ck_dims *d, uint64_t L, bool fused)
{
    const uint64_t E = p->E;
    if (m->head.classes && !m->head.mlm) {
        /* GenericForSequenceClassification: score's (B, T, classes) logits
         * (saving the norm's output); `input_ids != pad` (bool) .to(int32),
         * arange(T) int32, their product, its argmax (int64, saved by the
         * pooling index), arange(B) (int64, saved), then the pooled (B,
         * classes) logits, the head's output (L). The logits, the int32
         * mask and arange(T) stay in forward's scope through the loss: the
         * loss block holds them (chain_head.c), so here they go at the end */
        const uint64_t C = d->BT * (L / d->B), BT4 = d->BT * 4, T4 = d->T * 4, B8 = d->B * 8;
        norm(p, m);
        put(p, C);
        drop_saved(p, E);
        if (m->head.cls_no_pad) {
            /* no pad token: the last position, -1, a select; arange(B)
             * (saved) and the pooled logits; the logits held to the loss */
            put(p, B8);
            put(p, L);
            drop_saved(p, B8);
            drop(p, C);
            return;
        }
        put(p, d->BT);
        put(p, BT4);
        drop(p, d->BT);
        put(p, T4);
        put(p, BT4);
        put(p, B8);
        drop(p, BT4);
        put(p, B8);
        put(p, L);
        drop_saved(p, 2 * B8);
        drop(p, C + BT4 + T4);
        return;
    }
    if (m->head.mlm) {
        put(p, E); /* dense */
        put(p, E); /* act */
        drop_if(p, E, m->mlp.activation != ML_ACT_RELU);
        layernorm(p);
        drop_saved(p, E);
    } else {
        norm(p, m);
    }
    if (fused)
        return;
    put(p, L); /* LM head / decoder */
    drop_saved(p, E);
    if (m->head.final_softcap > 0) {
        put(p, L);
        drop(p, L);
        put(p, L);
        drop(p, L);
        put(p, L);
        drop_saved(p, L);
    }
}

static void run(prog *p, const ml_model *m, const ml_ck_dims *d, uint64_t L, bool fused)
{
    memset(&p->g, 0, sizeof p->g);
    if (L || fused)
        head(p, m, d, L, fused);
    else if (m->residual.prenorm)
        prenorm_layer(p, m, d);
    else
        postnorm_layer(p, m);
}

/* The programs of a layer (L = 0) or of a head making L bytes of logits
 * (fused: the head ends at its norm). */
static void programs(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                     uint64_t L, bool fused)
{
    /* the layouts written out: eager attention, no autocast casts, no
     * parallel residual, no vision encoder, no experts; with grad, every saved tensor
     * kept (not selective checkpointing) */
    const bool layernorm = m->norms.kind == ML_NORM_LAYERNORM;
    const bool glu = m->mlp.activation == ML_ACT_SWIGLU || m->mlp.activation == ML_ACT_GEGLU;
    if (ch->prec.autocast || m->attn.kernel != ML_ATTN_EAGER || m->residual.parallel ||
        m->embed.image_size || m->moe.experts || m->attn.kv_lora || ch->overflow)
        return;
    /* the nanoGPT layout has no rotary; the post-norm one is BERT's */
    if ((layernorm && m->embed.position == ML_POS_ROPE) ||
        (!m->residual.prenorm && (!layernorm || glu || m->embed.position == ML_POS_ROPE)))
        return;
    const unsigned a = ch->prec.a, w = ch->prec.w;
    const uint64_t BTD = ml_mul(ch, d->BT, d->D), BHTT = ml_mul(ch, ml_mul(ch, d->B, d->H),
                                                                 ml_mul(ch, d->T, d->T));
    prog p;
    memset(&p, 0, sizeof p);
    p.E = ml_mul(ch, BTD, w);
    p.E32 = ml_mul(ch, BTD, 4);
    p.st = ml_mul(ch, d->BT, 4);
    p.Eq = ml_mul(ch, ml_mul(ch, d->BT, ml_mul(ch, d->H, d->dh)), a);
    p.Ek = ml_mul(ch, ml_mul(ch, d->BT, d->Dkv), a);
    p.S = ml_mul(ch, BHTT, a);
    p.S32 = ml_mul(ch, BHTT, 4);
    p.Sb = BHTT;
    p.EF = ml_mul(ch, ml_mul(ch, d->BT, d->F), a);
    p.Eb = BTD;
    p.TT = ml_mul(ch, d->T, d->T);
    p.Dw = ml_mul(ch, d->D, 4);
    if (ch->overflow)
        return;
    p.drop = d->drop && !ch->eval_mode;
    p.fp16 = ch->prec.fp16;
    p.keeps_in = layernorm || w == 4;
    /* a KV cache in evaluation: HF's Llama layout with separate k and v */
    if (ch->eval_mode && m->attn.kv_cache && !layernorm && !m->attn.fused_proj && !L && !fused)
        p.later = 2 * p.Ek;
    const uint64_t out = L ? L : p.E;
    run(&p, m, d, L, fused);
    ml__ck_ng_close(b, &p.g, out);
    if (ch->selective)
        return;
    p.grad = true;
    run(&p, m, d, L, fused);
    ml__ck_grad_close(b, &p.g, out);
}

void ml__ck_forward_layer(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d)
{
    programs(ch, b, m, d, 0, false);
}

void ml__ck_forward_head(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                       bool fused)
{
    /* a decoder's LM head or BERT's masked-LM head; the classifiers' (B, D)
     * tensors keep the block rule */
    if (m->type == ML_MODEL_ENCODER && !m->head.mlm)
        return;
    uint64_t L = m->head.classes ? ml_mul(ch, ml_mul(ch, d->B, m->head.classes), ch->prec.a)
                                 : ml_mul(ch, ml_mul(ch, d->BT, d->V), ch->prec.a);
    programs(ch, b, m, d, fused ? 0 : L, fused);
}
