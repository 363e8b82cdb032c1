/* T5's chain (HF T5ForConditionalGeneration, transformers 4.5x
 * modeling_t5.py): the encoder's embedding and blocks, its final norm, the
 * decoder's embedding and blocks (self-attention, cross-attention over the
 * encoder's output, feed-forward), the head and the loss. What each op
 * keeps for its backward: docs/inventory.md, "T5". The tensors that live
 * beside the stream of blocks (the position biases the stacks' loops hold,
 * the encoder's output every cross-attention reads, and their gradients)
 * are the chain's side tensors (docs/ledger.md, "Side tensors"), derived
 * from the op graphs that make and read them (chain_graph_t5.c; docs/
 * graph.md, "T5's side tensors"). The layers, the embeddings,
 * encoder.final and the head come from the op graph (graph/kit_t5.c,
 * kit_embed.c; t5_stack below); t5_norm, t5_attention, t5_ff,
 * builder_sides and the builders' branches below are
 * ml__chain_build_builders' (the reference tests/unit/test_graph_t5.c
 * compares against). The blocks keep the block-level backward rule. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ledger/chain_kit.h"

typedef struct {
    uint64_t B, Ts, Td, D, I, F, H, V;
    unsigned a, w; /* the compute dtype's and the residual stream's bytes */
    bool drop;
    bool gated;    /* T5DenseGatedActDense (T5 v1.1, FLAN-T5) */
} t5d;

/* T5LayerNorm on x (B*T rows of D, the stream's dtype; its weight, D,
 * registered by the caller after the layer's module): variance of
 * x.to(float32) squared, x * rsqrt(variance + eps), cast to the weight's
 * dtype when it is half, then weight * h. pow saves its fp32 input (x
 * itself when x is fp32, else a copy), the mul x and rsqrt's result, the
 * scale the normalised h (derivatives.yaml: pow, mul, rsqrt). */
static void t5_norm(ml_chain *ch, ml_cblock *b, const t5d *t, uint64_t BT, unsigned xflags)
{
    uint64_t BTD = ml_mul(ch, BT, t->D);
    if (t->w == 4) {
        ml__ck_save(ch, b, "layer norm input", BTD, 4, xflags);
    } else {
        ml__ck_save(ch, b, "layer norm fp32 copy of input (pow)", BTD, 4, 0);
        ml__ck_save(ch, b, "layer norm input (x * rsqrt)", BTD, t->w, xflags);
    }
    ml__ck_save(ch, b, "layer norm rsqrt", BT, 4, 0);
    ml__ck_save(ch, b, t->w == 4 ? "layer norm normalised" : "layer norm normalised (cast)", BTD,
                t->w, 0);
    ml__ck_tmp(ch, BTD, 4);
}

/* T5Attention, eager (no scaling; the position bias added in place to the
 * scores; softmax over scores.float(), type_as the scores; dropout; the
 * matmul with v; the output projection), then the layer's dropout and the
 * residual. Tq query rows over Tk key rows; cross: k and v project the
 * encoder's output (a side tensor: saved, not this block's). first: the
 * stack's first block, whose self-attention embeds the relative-position
 * buckets (its relative_attention_bias). */
static void t5_attention(ml_chain *ch, ml_cblock *b, const t5d *t, uint64_t Tq, uint64_t Tk,
                         bool cross, bool first, uint64_t buckets)
{
    const unsigned a = t->a;
    uint64_t BTq = ml_mul(ch, t->B, Tq), BTk = ml_mul(ch, t->B, Tk);
    uint64_t S = ml__ck_mul3(ch, ml_mul(ch, t->B, t->H), Tq, Tk);
    t5_norm(ch, b, t, BTq, cross ? 0 : ML_SV_INPUT);
    /* q, k, v read the norm's output, or, crossing, k and v the encoder's
     * (a side tensor, saved once): under autocast each Linear keeps a cast */
    uint64_t qin = ml_mul(ch, BTq, t->D), kin = ml_mul(ch, BTk, t->D);
    ml__ck_linear_input(ch, b, "q input", qin, t->w, false, 0);
    for (int i = 0; i < 2; i++)
        ml__ck_linear_input(ch, b, cross ? "k/v input (the encoder output)" : "k/v input",
                            cross ? kin : qin, t->w, true, 0);
    ml__ck_weight_copy(ch, b, ml_mul(ch, 4, ml_mul(ch, t->D, t->I)));
    for (int i = 0; i < 4; i++) /* q, k, v, o */
        ml__ck_param(ch, b, t->D, t->I);
    if (first && !cross) {
        ml__ck_param(ch, b, buckets, t->H); /* relative_attention_bias */
        ml__ck_save(ch, b, "relative position buckets (int64)", ml_mul(ch, Tq, Tk), 8, 0);
    }
    ml__ck_param(ch, b, t->D, 0); /* the layer's layer_norm */
    ml__ck_save(ch, b, "q (scores matmul)", ml_mul(ch, BTq, t->I), a, 0);
    ml__ck_save(ch, b, "k (scores matmul)", ml_mul(ch, BTk, t->I), a, 0);
    ml__ck_tmp(ch, S, a);
    /* the attention core, the T x T tensors: dropped and recomputed under
     * checkpoint: selective */
    ml__ck_save(ch, b, "softmax output (fp32)", S, 4, ML_SV_CORE);
    if (t->drop) {
        ml__ck_save(ch, b, "attention dropout mask", S, 1, ML_SV_CORE);
        ml__ck_save(ch, b, "attention probabilities (dropout output)", S, a, ML_SV_CORE);
    } else if (a != 4) {
        ml__ck_save(ch, b, "attention probabilities (type_as cast)", S, a, ML_SV_CORE);
    }
    ml__ck_save(ch, b, "v (context matmul)", ml_mul(ch, BTk, t->I), a, 0);
    ml__ck_save(ch, b, "o input (heads merged)", ml_mul(ch, BTq, t->I), a, 0);
    uint64_t BTD = ml_mul(ch, BTq, t->D);
    ml__ck_tmp(ch, BTD, a);
    if (t->drop)
        ml__ck_save(ch, b, "attention output dropout mask", BTD, 1, 0);
    double proj = 2.0 * (double)t->B * (double)t->D * (double)t->I;
    double core = 4.0 * (double)S * (double)(t->I / t->H);
    b->flops_fwd += proj * (2.0 * (double)Tq + 2.0 * (double)Tk) + core;
    b->flops_core += core;
}

/* T5DenseGatedActDense's gelu_new(wi_0(x)) * wi_1(x) (NewGELUActivation,
 * activations.py: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 *
 * pow(x, 3))))): pow keeps x, tanh its result, the last mul 0.5 * x and
 * 1 + tanh, the gate's mul the GELU's output and wi_1's; the Python floats
 * keep nothing on the device. Under CUDA autocast pow runs in fp32
 * (autocast_mode.cpp's fp32 list): it keeps an fp32 copy of x, and what
 * follows it is fp32 by promotion (tanh, 1 + tanh, the GELU's output and
 * the gated product) but 0.5 * x. Returns the gated product's bytes per
 * element. */
static unsigned gated_gelu(ml_chain *ch, ml_cblock *b, const t5d *t, uint64_t BTF)
{
    const unsigned a = t->a, p = ch->prec.autocast ? 4 : a;
    ml__ck_save(ch, b, ch->prec.autocast ? "wi_0 output, fp32 copy (pow)" : "wi_0 output (pow)",
                BTF, p, 0);
    ml__ck_tmp(ch, BTF, p);
    ml__ck_save(ch, b, "gelu_new tanh output", BTF, p, 0);
    ml__ck_save(ch, b, "gelu_new 0.5 * x", BTF, a, 0);
    ml__ck_save(ch, b, "gelu_new 1 + tanh", BTF, p, 0);
    ml__ck_save(ch, b, "gelu_new output (gate)", BTF, p, 0);
    ml__ck_save(ch, b, "wi_1 output", BTF, a, 0);
    return p;
}

/* T5LayerFF with T5DenseActDense (wi, relu) or T5DenseGatedActDense
 * (gelu_new(wi_0) * wi_1), then dropout, (an activation whose dtype is not
 * wo's fp32 weight's is cast to it, which autocast casts back), wo, the
 * layer's dropout and the residual. */
static void t5_ff(ml_chain *ch, ml_cblock *b, const t5d *t, uint64_t T)
{
    const unsigned a = t->a;
    const unsigned nin = t->gated ? 2 : 1;
    uint64_t BT = ml_mul(ch, t->B, T), BTD = ml_mul(ch, BT, t->D), BTF = ml_mul(ch, BT, t->F);
    t5_norm(ch, b, t, BT, 0);
    for (unsigned i = 0; i < nin; i++)
        ml__ck_linear_input(ch, b, t->gated ? "wi_0/wi_1 input" : "wi input", BTD, t->w, i > 0,
                            0);
    ml__ck_weight_copy(ch, b, ml_mul(ch, nin + 1, ml_mul(ch, t->D, t->F)));
    for (unsigned i = 0; i < nin; i++)
        ml__ck_param(ch, b, t->D, t->F); /* wi, or wi_0 and wi_1 */
    ml__ck_param(ch, b, t->F, t->D);     /* wo */
    ml__ck_param(ch, b, t->D, 0);        /* layer_norm */
    ml__ck_tmp(ch, BTF, a);
    unsigned act = a; /* the activation's bytes per element */
    if (t->gated)
        act = gated_gelu(ch, b, t, BTF);
    else
        ml__ck_save(ch, b, "relu output", BTF, a, 0);
    if (t->drop)
        ml__ck_save(ch, b, "feed-forward dropout mask", BTF, 1, 0);
    if (ch->prec.autocast) {
        if (act == 2)
            ml__ck_tmp(ch, BTF, 4); /* .to(wo.weight.dtype) */
        ml__ck_save(ch, b, "wo input (autocast's cast)", BTF, 2, 0);
    } else if (t->drop || t->gated) {
        ml__ck_save(ch, b, t->drop ? "wo input (dropout output)" : "wo input (gated product)",
                    BTF, a, 0);
    }
    ml__ck_tmp(ch, BTD, a);
    if (t->drop)
        ml__ck_save(ch, b, "feed-forward output dropout mask", BTD, 1, 0);
    b->flops_fwd += 2.0 * (nin + 1) * (double)BT * (double)t->D * (double)t->F;
}

/* Starts a block reading `in` bytes. */
static ml_cblock *begin(ml_chain *ch, const char *name, int ckpt, uint64_t in)
{
    ml_cblock *b = ml__ck_begin(ch, name, ckpt);
    if (b)
        b->in_bytes = in;
    return b;
}

/* An embedding of B*T ids into the shared table (dropout after): the ids
 * are its input (saved). shared: the table's gradient is not created here
 * (its dense gradient is added into .grad, a transient). */
static ml_cblock *t5_embedding(ml_chain *ch, const ml_model *m, const t5d *t, ml_ck_graph *G,
                               const char *name, uint64_t T, bool params, bool creates_grad)
{
    uint64_t BT = ml_mul(ch, t->B, T), BTD = ml_mul(ch, BT, t->D);
    ml_cblock *b = begin(ch, name, -1, ml_mul(ch, BT, 8));
    if (!b)
        return NULL;
    b->in_nograd = true;
    /* from the op graph (graph/kit_embed.c) unless the builders' alone */
    const ml_ck_dims d = {.B = t->B, .T = T, .BT = BT, .D = t->D, .V = t->V, .drop = t->drop};
    if (G && ml__ck_graph_t5_embedding(ch, m, &d, !params, G)) {
        ml__ck_graph_emit(ch, b, G, ml_mul(ch, BTD, t->w));
    } else {
        ml__ck_save(ch, b, "token ids (int64)", BT, 8, ML_SV_INPUT);
        if (params)
            ml__ck_param(ch, b, t->V, t->D);
        ml__ck_tmp(ch, BTD, t->w);
        if (t->drop)
            ml__ck_save(ch, b, "embedding dropout mask", BTD, 1, 0);
        ml__ck_end(ch, b, ml_mul(ch, BTD, t->w));
    }
    uint64_t g = ml_mul(ch, ml_mul(ch, t->V, t->D), ch->prec.grad);
    if (params) {
        b->grad_bytes -= g;
        b->grad_accum_bytes -= g;
    }
    if (creates_grad) {
        b->grad_bytes = ml_add(ch, b->grad_bytes, g);
        b->grad_accum_bytes = ml_add(ch, b->grad_accum_bytes, g);
    } else {
        b->ws_bwd = ml_add(ch, b->ws_bwd, g);
    }
    return b;
}

/* A side tensor (chain.h); bytes 0: none. Whether it was added. */
static bool side(ml_chain *ch, const char *what, uint64_t bytes, size_t from, size_t to,
                 bool to_bwd, bool ckpt_kept)
{
    ml_side *s = ml__ck_side(ch, what, bytes, from, to);
    if (s) {
        s->to_bwd = to_bwd;
        s->ckpt_kept = ckpt_kept;
    }
    return s != NULL;
}

/* The gradient of the side tensor just added (added: side()'s answer). */
static void side_grad(ml_chain *ch, bool added, uint64_t grad, size_t from, size_t to)
{
    if (added && !ch->eval_mode) {
        ml_side *s = &ch->sides[ch->nsides - 1];
        s->grad = grad;
        s->grad_from = (uint32_t)from;
        s->grad_to = (uint32_t)to;
    }
}

/* The tensors T5Stack.forward holds through its blocks (modeling_t5.py):
 * the attention mask it makes of ones when given none (fp32), the extended
 * or causal mask it passes to every block (the stream's dtype) with
 * cache_position (int64), the embedding's output beside its dropout's;
 * the decoder's also the encoder's mask of ones (int64) and its inverted
 * (B, 1, 1, Ts) mask. The stack made at block `emb` returns at `end`. */
static void stack_sides(ml_chain *ch, const t5d *t, bool dec, size_t emb, size_t end)
{
    uint64_t T = dec ? t->Td : t->Ts, BT = ml_mul(ch, t->B, T);
    uint64_t BTs = ml_mul(ch, t->B, t->Ts);
    side(ch, "attention mask of ones (fp32)", ml_mul(ch, BT, 4), emb, end, false, false);
    side(ch, dec ? "causal mask (B, 1, T, T)" : "extended attention mask (B, 1, 1, T)",
         ml_mul(ch, dec ? ml_mul(ch, BT, T) : BT, t->w), emb, end, false, true);
    side(ch, "cache_position (int64)", ml_mul(ch, T, 8), emb, end, false, true);
    if (t->drop)
        side(ch, "embedding output (inputs_embeds, before its dropout)",
             ml__ck_mul3(ch, BT, t->D, t->w), emb, end, false, false);
    if (dec) {
        side(ch, "encoder attention mask of ones (int64)", ml_mul(ch, BTs, 8), emb, end, false,
             false);
        side(ch, "inverted encoder mask (B, 1, 1, Ts)", ml_mul(ch, BTs, t->w), emb, end, false,
             true);
    }
}

/* The name "encoder.block.<i>" or "decoder.block.<i>". */
static void stack_name(char name[48], const char *stack, uint64_t i)
{
    snprintf(name, 48, "%s.block.%llu", stack, (unsigned long long)i);
}

/* A stack's layers from T5's op graphs (graph/kit_t5.h; docs/graph.md):
 * the first layer emitted from its graph, the second from the other
 * layers' graph, the rest copies of the second (ml__ck_graph_repeat); the
 * side tensors their graphs make and read noted in S. */
typedef struct {
    ml_ck_graph *G; /* NULL: the chain builders write the layers */
    ml_ck_dims d;   /* the stack's tokens, T5's widths */
    bool decoder;
    size_t proto, pfirst, pcount; /* the second layer's block, its parameters */
    ml_ck_sides *S;
    size_t scope; /* the stack's closing block (its final_layer_norm's) */
} t5_stack;

static t5_stack stack_of(ml_chain *ch, const ml_model *m, const t5d *t, ml_ck_graph *G,
                         bool decoder, ml_ck_sides *S)
{
    const uint64_t T = decoder ? t->Td : t->Ts;
    t5_stack s = {.G = G, .decoder = decoder, .S = S};
    s.d = (ml_ck_dims){.B = t->B, .T = T, .BT = ml_mul(ch, t->B, T), .D = t->D, .F = t->F,
                       .H = t->H, .Hkv = t->H, .dh = m->head_dim, .Dkv = t->I, .V = t->V,
                       .drop = t->drop};
    return s;
}

/* T5Stack's own tensors (graph/kit_t5.h), made where its embedding runs
 * (the block before its first layer) and held to its closing block. */
static void note_stack(ml_chain *ch, const ml_model *m, const t5d *t, t5_stack *s)
{
    const size_t emb = ch->n - 1;
    s->scope = ch->n + (s->decoder ? m->dec_layers : m->layers);
    if (!s->G || !ml__ck_graph_t5_stack(ch, m, &s->d, t->Ts, s->decoder, s->G)) {
        s->S->refused = true;
        return;
    }
    ml__ck_t5_sides_note(s->G, emb, s->scope, false, s->S);
}

/* Layer i of stack s into b from the graph (out: its output's bytes);
 * false: the builders write it (no graph, or the graph declined). */
static bool graph_layer(ml_chain *ch, const ml_model *m, const t5d *t, t5_stack *s,
                        ml_cblock *b, uint64_t i, uint64_t out)
{
    const size_t k = (size_t)(b - ch->blocks);
    if (!s->G) {
        s->S->refused = true;
        return false;
    }
    if (i >= 2) { /* G is still the second layer's */
        ml__ck_graph_repeat(ch, b, s->proto, s->pfirst, s->pcount);
        ml__ck_t5_sides_note(s->G, k, s->scope, true, s->S);
        return true;
    }
    if (!ml__ck_graph_t5(ch, m, &s->d, t->Ts, s->decoder, i == 0, s->G)) {
        s->G = NULL;
        s->S->refused = true;
        return false;
    }
    const size_t p0 = ch->nparams;
    ml__ck_graph_emit(ch, b, s->G, out);
    ml__ck_t5_sides_note(s->G, k, s->scope, true, s->S);
    s->pfirst = p0;
    s->pcount = ch->nparams - p0;
    s->proto = k;
    return true;
}

static ml_status encoder(ml_chain *ch, const ml_model *m, const t5d *t, ml_ck_graph *G,
                         ml_ck_sides *S, size_t *enc_first)
{
    t5_stack s = stack_of(ch, m, t, G, false, S);
    uint64_t BTD = ml_mul(ch, ml_mul(ch, t->B, t->Ts), t->D);
    if (!t5_embedding(ch, m, t, G, "embedding", t->Ts, true, false))
        return ML_NOMEM;
    *enc_first = ch->n;
    note_stack(ch, m, t, &s);
    for (uint64_t i = 0; i < m->layers; i++) {
        char name[48];
        stack_name(name, "encoder", i);
        ml_cblock *b = begin(ch, name, (int)i, ml_mul(ch, BTD, t->w));
        if (!b)
            return ML_NOMEM;
        if (graph_layer(ch, m, t, &s, b, i, ml_mul(ch, BTD, t->w)))
            continue;
        t5_attention(ch, b, t, t->Ts, t->Ts, false, i == 0, m->rel_buckets);
        t5_ff(ch, b, t, t->Ts);
        ml__ck_end(ch, b, ml_mul(ch, BTD, t->w));
    }
    /* final_layer_norm, dropout: the encoder's output */
    ml_cblock *b = begin(ch, "encoder.final", -1, ml_mul(ch, BTD, t->w));
    if (!b)
        return ML_NOMEM;
    /* its output is a side tensor; its boundary is the decoder's ids */
    if (G && ml__ck_graph_t5_final(ch, m, &s.d, G)) {
        ml__ck_graph_emit(ch, b, G, 0);
        ml__ck_t5_sides_note(G, (size_t)(b - ch->blocks), SIZE_MAX, false, S);
    } else {
        S->refused = true;
        t5_norm(ch, b, t, ml_mul(ch, t->B, t->Ts), ML_SV_INPUT);
        ml__ck_param(ch, b, t->D, 0);
        ml__ck_tmp(ch, BTD, t->w);
        if (t->drop)
            ml__ck_save(ch, b, "encoder output dropout mask", BTD, 1, 0);
        ml__ck_end(ch, b, 0);
    }
    b->bwd_in = 0;
    return ML_OK;
}

static ml_status decoder(ml_chain *ch, const ml_model *m, const t5d *t, ml_ck_graph *G,
                         ml_ck_sides *S, size_t *dec_first)
{
    t5_stack s = stack_of(ch, m, t, G, true, S);
    uint64_t BTD = ml_mul(ch, ml_mul(ch, t->B, t->Td), t->D);
    /* _shift_right(labels): the decoder's ids */
    if (!t5_embedding(ch, m, t, G, "decoder.embedding", t->Td, false,
                      !m->tied_embeddings))
        return ML_NOMEM;
    *dec_first = ch->n;
    note_stack(ch, m, t, &s);
    for (uint64_t i = 0; i < m->dec_layers; i++) {
        char name[48];
        stack_name(name, "decoder", i);
        ml_cblock *b = begin(ch, name, (int)(m->layers + i), ml_mul(ch, BTD, t->w));
        if (!b)
            return ML_NOMEM;
        if (!graph_layer(ch, m, t, &s, b, i, ml_mul(ch, BTD, t->w))) {
            t5_attention(ch, b, t, t->Td, t->Td, false, i == 0, m->rel_buckets);
            t5_attention(ch, b, t, t->Td, t->Ts, true, i == 0, m->rel_buckets);
            t5_ff(ch, b, t, t->Td);
            ml__ck_end(ch, b, ml_mul(ch, BTD, t->w));
        }
        /* use_cache: the evaluation output holds the block's self- and
         * cross-attention keys and values (EncoderDecoderCache), H x dkv
         * wide over Td and Ts rows */
        if (m->kv_cache)
            b->cache_bytes = ml_mul(ch, ml__ck_mul3(ch, 2, t->B, ml_add(ch, t->Td, t->Ts)),
                                    ml_mul(ch, t->I, t->a));
    }
    return ML_OK;
}

/* The decoder's final_layer_norm and dropout, the rescale by D^-0.5 when
 * the head is tied to the shared table (a Python float: nothing saved), and
 * lm_head; then the cross-entropy. */
static ml_status head(ml_chain *ch, const ml_model *m, const t5d *t, const ml_ck_dims *d,
                      ml_ck_graph *G)
{
    uint64_t BT = ml_mul(ch, t->B, t->Td), BTD = ml_mul(ch, BT, t->D);
    ml_cblock *b = begin(ch, "head", -1, ml_mul(ch, BTD, t->w));
    if (!b)
        return ML_NOMEM;
    uint64_t g = ml_mul(ch, ml_mul(ch, t->V, t->D), ch->prec.grad);
    if (G && ml__ck_graph_t5_head(ch, m, d, G)) {
        ml__ck_graph_emit(ch, b, G, ml_mul(ch, ml_mul(ch, BT, t->V), t->a));
        if (m->tied_embeddings) { /* the shared table's .grad is created here */
            b->grad_bytes = ml_add(ch, b->grad_bytes, g);
            b->grad_accum_bytes = ml_add(ch, b->grad_accum_bytes, g);
        }
        return ml__ck_ce_loss(ch, m, d, BT, t->V);
    }
    t5_norm(ch, b, t, BT, ML_SV_INPUT);
    ml__ck_param(ch, b, t->D, 0); /* the decoder's final_layer_norm */
    if (t->drop)
        ml__ck_save(ch, b, "decoder output dropout mask", BTD, 1, 0);
    ml__ck_tmp(ch, BTD, t->w);
    ml__ck_linear_input(ch, b, "lm_head input", BTD, t->w, false, 0);
    ml__ck_weight_copy(ch, b, ml_mul(ch, t->V, t->D));
    if (!m->tied_embeddings)
        ml__ck_param(ch, b, t->V, t->D);
    b->flops_fwd = 2.0 * (double)BT * (double)t->D * (double)t->V;
    uint64_t logits = ml_mul(ch, BT, t->V);
    ml__ck_end(ch, b, ml_mul(ch, logits, t->a));
    if (m->tied_embeddings) { /* the shared table's .grad is created here */
        b->grad_bytes = ml_add(ch, b->grad_bytes, g);
        b->grad_accum_bytes = ml_add(ch, b->grad_accum_bytes, g);
    }
    return ml__ck_ce_loss(ch, m, d, BT, t->V);
}

/* The side tensors as the chain builders wrote them (the reference
 * ml__chain_build_builders keeps; the graph's when a block declined it):
 * the stacks' own (stack_sides), the position biases, the encoder's
 * output, with their gradients. enc0, dec0: the stacks' first layers;
 * fin, hd: their closing blocks. */
static void builder_sides(ml_chain *ch, const t5d *t, size_t enc0, size_t fin, size_t dec0,
                          size_t hd)
{
    const unsigned w = t->w;
    uint64_t bias_s = ml_mul(ch, ml__ck_mul3(ch, t->B, t->H, ml_mul(ch, t->Ts, t->Ts)), w);
    uint64_t bias_d = ml_mul(ch, ml__ck_mul3(ch, t->B, t->H, ml_mul(ch, t->Td, t->Td)), w);
    uint64_t bias_x = ml_mul(ch, ml__ck_mul3(ch, t->B, t->H, ml_mul(ch, t->Td, t->Ts)), w);
    uint64_t enc_out = ml_mul(ch, ml__ck_mul3(ch, t->B, t->Ts, t->D), w);
    size_t enc_last = fin - 1, dec_last = hd - 1, loss = ch->n - 1;
    stack_sides(ch, t, false, enc0 - 1, fin);
    bool added = side(ch, "encoder position bias (B, H, Ts, Ts)", bias_s, enc0, fin, false, true);
    side_grad(ch, added, bias_s, enc_last, enc0);
    /* fp32: the cross-attentions' k and v save the encoder's output itself
     * (released by the first decoder block's backward); under autocast they
     * save casts, and the model's forward holds it until it returns */
    bool saved = !ch->eval_mode && !ch->prec.autocast;
    added = side(ch, "encoder output", enc_out, fin, saved ? dec0 : loss, saved, true);
    side_grad(ch, added, enc_out, dec_last, fin);
    stack_sides(ch, t, true, dec0 - 1, hd);
    added = side(ch, "decoder self-attention position bias (B, H, Td, Td)", bias_d, dec0, hd,
                 false, true);
    side_grad(ch, added, bias_d, dec_last, dec0);
    side(ch, "cross-attention position bias (B, H, Td, Ts)", bias_x, dec0, hd, false, true);
}

/* The side tensors from the op graphs (ml__ck_t5_sides_add: T5Stack's
 * own, the position biases, the encoder's output), in the order the
 * graphs make them; the builders' list where S was refused. */
static void sides(ml_chain *ch, const t5d *t, const ml_ck_sides *S, size_t enc0, size_t fin,
                  size_t dec0, size_t hd)
{
    if (S->refused)
        builder_sides(ch, t, enc0, fin, dec0, hd);
    else
        ml__ck_t5_sides_add(ch, S, ch->n - 1);
}

ml_status ml__chain_build_t5(const ml_model *m, const ml_config *cfg, ml_chain *ch)
{
    const ml_training *tr = &cfg->training;
    t5d t = {.B = tr->micro_batch,
             .Ts = tr->seq_len,
             .Td = tr->target_len ? tr->target_len : tr->seq_len,
             .D = m->hidden,
             .I = ml_mul(ch, m->heads, m->head_dim),
             .F = m->ffn,
             .H = m->heads,
             .V = m->vocab,
             .a = ch->prec.a,
             .w = ch->prec.w,
             .drop = m->dropout > 0 && !ch->eval_mode,
             .gated = m->activation == ML_ACT_GEGLU};
    ml_ck_dims d = {.B = t.B, .T = t.Td, .BT = ml_mul(ch, t.B, t.Td), .D = t.D, .V = t.V};
    ch->B = t.B;
    ch->T = t.Ts;
    ch->c_tokens = ml_mul(ch, t.B, t.Ts);
    ch->c_width = t.D;
    ch->record_nodes = false;
    size_t enc0 = 0, dec0 = 0;
    /* the layers' op graphs (the builders' alone: ml__chain_build_builders) */
    ml_ck_graph *G = ch->builders_only ? NULL : malloc(sizeof *G);
    if (!ch->builders_only && !G)
        return ML_NOMEM;
    ml_ck_sides S = {.refused = ch->builders_only};
    ml_status st = encoder(ch, m, &t, G, &S, &enc0);
    size_t fin = ch->n - 1;
    if (st == ML_OK)
        st = decoder(ch, m, &t, G, &S, &dec0);
    size_t hd = ch->n;
    if (st == ML_OK)
        st = head(ch, m, &t, &d, G);
    free(G);
    if (st != ML_OK || ch->overflow)
        return st;
    ch->n_ckpt = m->layers + m->dec_layers;
    sides(ch, &t, &S, enc0, fin, dec0, hd);
    for (size_t i = 0; i < ch->n; i++)
        if (ch->blocks[i].flops_bwd == 0)
            ch->blocks[i].flops_bwd = 2.0 * ch->blocks[i].flops_fwd;
    return ML_OK;
}
