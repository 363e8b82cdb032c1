/* The op kit of the chain builders (chain_kit.h): checked arithmetic, the
 * precision table, block bookkeeping and the attention core. Each call
 * records what PyTorch's eager autograd keeps for one op; sources in
 * docs/inventory.md. */
#include <string.h>

#include "ledger/chain_kit.h"
#include "util/grow.h"

uint64_t ml__ck_mul3(ml_chain *ch, uint64_t a, uint64_t b, uint64_t c)
{
    return ml_mul(ch, ml_mul(ch, a, b), c);
}

ml_prec ml__prec_of(ml_precision p)
{
    /*                        param grad master state a  w  autocast fp16 */
    static const ml_prec t[ML_PREC_COUNT] = {
        [ML_PREC_FP32] = {4, 4, 0, 4, 4, 4, false, false},
        [ML_PREC_AMP_BF16] = {4, 4, 0, 4, 2, 4, true, false},
        [ML_PREC_AMP_FP16] = {4, 4, 0, 4, 2, 4, true, true},
        [ML_PREC_BF16_MASTER] = {2, 2, 4, 4, 2, 2, false, false},
        [ML_PREC_FP16_MASTER] = {2, 2, 4, 4, 2, 2, false, true},
        [ML_PREC_BF16] = {2, 2, 0, 2, 2, 2, false, false},
    };
    return t[p];
}

/* ---- building blocks ------------------------------------------------- */

ml_cblock *ml__ck_begin(ml_chain *ch, const char *name, int ckpt_index)
{
    ml_cblock *grown = ml_grow(ch->blocks, ch->n, &ch->cap, sizeof *grown, 16);
    if (!grown) {
        ch->nomem = true;
        return NULL;
    }
    ch->blocks = grown;
    ml_cblock *b = &ch->blocks[ch->n++];
    memset(b, 0, sizeof *b);
    size_t len = strlen(name);
    if (len >= sizeof b->name)
        len = sizeof b->name - 1;
    memcpy(b->name, name, len);
    b->name[len] = '\0';
    b->fwd_phase = ML_PHASE_FORWARD;
    b->ckpt_index = ckpt_index;
    b->saved_first = ch->nsaved;
    b->node_first = ch->nnodes;
    ch->max_unsaved = ch->max_tensor = 0;
    return b;
}

void ml__ck_note(ml_chain *ch, uint64_t bytes, bool saved)
{
    if (bytes > ch->max_tensor)
        ch->max_tensor = bytes;
    if (!saved && bytes > ch->max_unsaved)
        ch->max_unsaved = bytes;
}

/* Records one saved storage of `elems` elements of `bpe` bytes. */
size_t ml__ck_save(ml_chain *ch, ml_cblock *b, const char *what, uint64_t elems, unsigned bpe,
                   unsigned flags)
{
    uint64_t bytes = ml_mul(ch, elems, bpe);
    if (flags & ML_SV_BATCH) {
        /* held by the loop all iteration: the batch, not this block's */
        ch->batch_targets = ml_add(ch, ch->batch_targets, bytes);
        ml__ck_note(ch, bytes, true);
        return SIZE_MAX;
    }
    if (flags & ML_SV_INPUT) {
        /* the block's input is a boundary tensor, accounted by the replay */
        b->in_saved = true;
        ml__ck_note(ch, bytes, true);
        return SIZE_MAX;
    }
    ml_saved *s = ml_grow(ch->saved, ch->nsaved, &ch->savedcap, sizeof *s, 64);
    if (!s) {
        ch->nomem = true;
        return SIZE_MAX;
    }
    ch->saved = s;
    size_t idx = ch->nsaved;
    ch->saved[ch->nsaved++] = (ml_saved){what, bytes, flags, ML_NODE_NONE, ML_NODE_NONE};
    b->nsaved++;
    b->saved_bytes = ml_add(ch, b->saved_bytes, bytes);
    if (flags & ML_SV_CORE)
        b->core_bytes = ml_add(ch, b->core_bytes, bytes);
    ml__ck_note(ch, bytes, true);
    return idx;
}

/* ---- backward nodes (docs/ledger.md, "Backward, node by node") -------- */

static ml_bnode *node_append(ml_chain *ch, ml_cblock *b)
{
    ml_bnode *n = ml_grow(ch->nodes, ch->nnodes, &ch->nodecap, sizeof *n, 64);
    if (!n) {
        ch->nomem = true;
        return NULL;
    }
    ch->nodes = n;
    b->nnodes++;
    n = &ch->nodes[ch->nnodes++];
    memset(n, 0, sizeof *n);
    return n;
}

static void node_claims(ml_chain *ch, ml_cblock *b, size_t s)
{
    if (s != SIZE_MAX && s < ch->nsaved && s >= b->saved_first)
        ch->saved[s].node = (uint32_t)(b->nnodes - 1);
}

void ml__ck_node(ml_chain *ch, ml_cblock *b, const char *what, uint64_t grad_in,
                 uint64_t param_grad, uint64_t grad_out, size_t s0, size_t s1)
{
    /* a chain that overflowed is refused: no node list for it */
    if (!ch->record_nodes || ch->overflow)
        return;
    ml_bnode *n = node_append(ch, b);
    if (!n)
        return;
    *n = (ml_bnode){what, grad_in, param_grad, 0, grad_out, ML_NODE_NONE};
    node_claims(ch, b, s0);
    node_claims(ch, b, s1);
}

void ml__ck_node_claim(ml_chain *ch, ml_cblock *b, size_t s)
{
    if (ch->record_nodes && !ch->overflow && b->nnodes)
        node_claims(ch, b, s);
}

void ml__ck_node_scratch(ml_chain *ch, ml_cblock *b, uint64_t bytes)
{
    if (ch->record_nodes && b->nnodes)
        ch->nodes[ch->nnodes - 1].scratch = bytes;
}

void ml__ck_accum(ml_chain *ch, ml_cblock *b, uint64_t bytes)
{
    ml__ck_node(ch, b, "InputBuffer accumulation (in place)", 0, 0, bytes, SIZE_MAX, SIZE_MAX);
}

/* Puts the block's nodes in execution order (the reverse of the forward's)
 * and checks them: the gradients balance (the output's gradient in, the
 * input's out) and the parameter gradients are the block's. A list that does not is dropped (the block-level backward
 * runs), never replayed wrong. */
static void nodes_close(ml_chain *ch, ml_cblock *b)
{
    if (!b->nnodes)
        return;
    ml_bnode *n = &ch->nodes[b->node_first];
    size_t m = b->nnodes;
    uint64_t gin = 0, gout = 0, pg = 0;
    for (size_t i = 0; i < m; i++) {
        gin = ml_add(ch, gin, n[i].grad_in);
        gout = ml_add(ch, gout, n[i].grad_out);
        pg = ml_add(ch, pg, n[i].param_grad);
    }
    /* a block whose forward made its gradients hands them over: its nodes
     * allocate neither */
    uint64_t in_grad = b->in_nograd || b->grads_in_fwd ? 0 : b->in_bytes;
    uint64_t own_pg = b->grads_in_fwd ? 0 : b->grad_bytes;
    if (ml_add(ch, gin, b->bwd_in) != ml_add(ch, gout, in_grad) || pg != own_pg ||
        b->measured || b->nodes_off) {
        ch->nnodes -= m;
        b->nnodes = 0;
        for (size_t s = b->saved_first; s < b->saved_first + b->nsaved; s++)
            ch->saved[s].node = ML_NODE_NONE;
        return;
    }
    for (size_t i = 0; i < m / 2; i++) {
        ml_bnode t = n[i];
        n[i] = n[m - 1 - i];
        n[m - 1 - i] = t;
    }
    for (size_t s = b->saved_first; s < b->saved_first + b->nsaved; s++)
        if (ch->saved[s].node != ML_NODE_NONE)
            ch->saved[s].node = (uint32_t)(m - 1 - ch->saved[s].node);
    /* each node's released tensors as a list in the saved list's order, so
     * the replay visits every saved tensor once (not once per node) */
    for (size_t s = b->saved_first + b->nsaved; s-- > b->saved_first;) {
        ml_saved *v = &ch->saved[s];
        v->next_same = ML_NODE_NONE;
        if (v->node == ML_NODE_NONE)
            continue;
        v->next_same = n[v->node].first_saved;
        n[v->node].first_saved = (uint32_t)(s - b->saved_first);
    }
    /* a block like the one before it (the repeated layers) shares its list:
     * node lists take memory for the distinct blocks only */
    const ml_cblock *prev = b > ch->blocks ? b - 1 : NULL;
    if (prev && prev->nnodes == m && prev->node_first + m <= b->node_first &&
        !memcmp(&ch->nodes[prev->node_first], n, m * sizeof *n)) {
        ch->nnodes -= m;
        b->node_first = prev->node_first;
    }
}

/* An intermediate that nothing saves. */
void ml__ck_tmp(ml_chain *ch, uint64_t elems, unsigned bpe)
{
    ml__ck_note(ch, ml_mul(ch, elems, bpe), false);
}

ml_side *ml__ck_side(ml_chain *ch, const char *what, uint64_t bytes, size_t from, size_t to)
{
    if (!bytes)
        return NULL;
    ml_side *s = ml_grow(ch->sides, ch->nsides, &ch->sidecap, sizeof *s, 8);
    if (!s) {
        ch->nomem = true;
        return NULL;
    }
    ch->sides = s;
    s = &ch->sides[ch->nsides++];
    *s = (ml_side){what, bytes, (uint32_t)from, (uint32_t)to, false, false, 0, 0, 0, false};
    return s;
}

/* A parameter tensor of the block: rows x cols (cols 0 for a vector). */
void ml__ck_param(ml_chain *ch, ml_cblock *b, uint64_t rows, uint64_t cols)
{
    uint64_t numel = cols ? ml_mul(ch, rows, cols) : rows;
    ml_ptensor *p = ml_grow(ch->params, ch->nparams, &ch->paramcap, sizeof *p, 64);
    if (!p) {
        ch->nomem = true;
        return;
    }
    ch->params = p;
    ch->params[ch->nparams++] = (ml_ptensor){numel, cols ? rows : 0, cols, false, false};
    b->params = ml_add(ch, b->params, numel);
    if (numel > ch->max_param_numel)
        ch->max_param_numel = numel;
}

/* A Linear's parameters as nn.Linear registers them: the (out, in) weight,
 * then its bias when it has one. */
void ml__ck_linear(ml_chain *ch, ml_cblock *b, uint64_t in, uint64_t out, bool bias)
{
    ml__ck_param(ch, b, in, out);
    if (bias)
        ml__ck_param(ch, b, out, 0);
}

/* Closes a block: transients from its largest tensors (docs/ledger.md,
 * "transients"), gradients its backward creates. */
void ml__ck_end(ml_chain *ch, ml_cblock *b, uint64_t out_bytes)
{
    b->ws_fwd = ml_add(ch, b->ws_fwd, ml_mul(ch, 2, ch->max_unsaved));
    b->ws_nograd = ml_mul(ch, 2, ch->max_tensor);
    b->unit_fwd = ch->max_unsaved;
    b->unit = ch->max_tensor;
    b->bwd_in = out_bytes;
    b->ws_bwd = ml_add(ch, b->ws_bwd, ml_add(ch, out_bytes, ml_mul(ch, 2, ch->max_tensor)));
    uint64_t g = ml_mul(ch, b->params, ch->prec.grad);
    b->grad_bytes = ml_add(ch, b->grad_bytes, g);
    b->grad_accum_bytes = ml_add(ch, b->grad_accum_bytes, g);
    nodes_close(ch, b);
}

void ml__ck_ng_close(ml_cblock *b, const ml_ck_ng *g, uint64_t out)
{
    if (!g->bad && g->live == out && g->peak >= out) {
        b->ws_nograd = g->peak - out;
        b->ws_nograd_ops = true;
    }
}

void ml__ck_grad_close(ml_cblock *b, const ml_ck_ng *g, uint64_t out)
{
    uint64_t end = b->saved_bytes + out; /* end < out: the sum wrapped */
    if (!g->bad && end >= out && g->live == end && g->peak >= end) {
        b->ws_fwd = g->peak - end;
        b->ws_fwd_ops = true;
    }
}

/* autocast caches one low-precision copy of each weight per forward; the
 * matmul saves it for the input gradient (only when its input needs one). */
void ml__ck_weight_copy(ml_chain *ch, ml_cblock *b, uint64_t elems)
{
    if (ch->prec.autocast) {
        ml__ck_save(ch, b, "weight cast copy (autocast)", elems, 2, 0);
        b->cast_bytes = ml_add(ch, b->cast_bytes, ml_mul(ch, elems, 2));
    }
}

/* Whether the attention runs a fused kernel (no T x T tensor). sdpa is
 * torch's scaled_dot_product_attention as its dispatcher picks a kernel
 * (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp): flash, memory-
 * efficient or cuDNN, except that none of them takes fp32 inputs with
 * grouped-query heads (enable_gqa, as transformers passes them), where it
 * runs the math kernel, which keeps what eager attention keeps (measured on
 * an H200: docs/calibration-h200.md). Falcon calls it with one key/value
 * head against H query heads and no enable_gqa: the fused kernels need
 * equal head counts (sdp_utils: check_batch_size_and_num_heads_dense), so
 * it runs the math kernel in every dtype (docs/inventory.md). */
bool ml__ck_fused_attention(const ml_chain *ch, const ml_model *m)
{
    if (m->attn.kernel == ML_ATTN_SDPA)
        return !((ch->prec.a == 4 || m->residual.shared_norm) && m->attn.kv_heads < m->attn.heads);
    return m->attn.kernel == ML_ATTN_FLASH;
}

/* Self-attention after its input projection(s). src_bpe: bytes per element of
 * the projection input. Adds parameters, FLOPs and saved tensors. */
/* Sizes the three parts of the attention share (elements, and the q and
 * k/v gradients in bytes). */
typedef struct {
    uint64_t BTD, Dq, BTQ, qkv_out, BHTT, gQ, gKV;
} attn_sizes;

/* The rotary embedding's and repeat_kv's nodes on the heads (Llama's
 * layout). Phi-3's apply_rotary_pos_emb splits q into the rotated part and
 * the passed one, q[..., rotary_dim:], empty when the whole head rotates,
 * and cats them back: the empty slice's SliceBackward0 still makes a
 * zero-filled gradient of q's size, the first to reach q's InputBuffer
 * (its node is the younger), so the rotary's gradient is added into it
 * (derivatives.yaml: slice_backward). */
static void rope_repeat_nodes(ml_chain *ch, ml_cblock *b, const ml_model *m,
                              const ml_ck_dims *d, attn_sizes *z)
{
    if (m->embed.position == ML_POS_ROPE) {
        /* q * cos + rotate_half(q) * sin (and k): the gradient through
         * the two products and the cat, one tensor of the head's size */
        static const char *const what[2][2] = {
            {"MulBackward0/CatBackward0 (rotary on q)", "SliceBackward0 (q pass, empty)"},
            {"MulBackward0/CatBackward0 (rotary on k)", "SliceBackward0 (k pass, empty)"}};
        for (unsigned i = 0; i < 2; i++) {
            uint64_t g = i == 0 ? z->gQ : z->gKV;
            const bool pass =
                m->attn.fused_proj || (m->residual.parallel && !m->residual.shared_norm);
            if (pass)
                ml__ck_accum(ch, b, g);
            ml__ck_node(ch, b, what[i][0], g, 0, g, SIZE_MAX, SIZE_MAX);
            if (pass)
                ml__ck_node(ch, b, what[i][1], g, 0, 0, SIZE_MAX, SIZE_MAX);
        }
    }
    if (d->Hkv < d->H) {
        /* repeat_kv: expand + reshape, whose backward sums the groups */
        ml__ck_node(ch, b, "ExpandBackward0 (repeat_kv of k)", z->gKV, 0, z->gQ, SIZE_MAX, SIZE_MAX);
        ml__ck_node(ch, b, "ExpandBackward0 (repeat_kv of v)", z->gKV, 0, z->gQ, SIZE_MAX, SIZE_MAX);
        z->gKV = z->gQ;
    }
}

/* Phi-3's qkv_proj: q, k and v are slices of its output, each viewed into
 * heads. Backward, per slice: the head view's reshape copies the
 * (transposed) gradient, SliceBackward0 makes a zero-filled gradient of the
 * whole output and copies it in; the first to arrive becomes the output's
 * InputBuffer, the two others are added and freed; then the projection. */
static void phi3_projection_nodes(ml_chain *ch, ml_cblock *b, const ml_ck_dims *d,
                                  const attn_sizes *z, uint64_t gBTD, uint64_t pgrad, size_t s_in,
                                  bool xbuf)
{
    const unsigned a = ch->prec.a;
    uint64_t gqkv = ml_mul(ch, ml_mul(ch, d->BT, z->qkv_out), a);
    if (xbuf)
        ml__ck_accum(ch, b, gBTD);
    ml__ck_node(ch, b, "MmBackward0 (qkv projection)", gBTD, pgrad, gqkv, s_in, SIZE_MAX);
    static const char *const sl[3] = {"SliceBackward0 (q of qkv)", "SliceBackward0 (k of qkv)",
                                      "SliceBackward0 (v of qkv)"};
    for (unsigned i = 0; i < 3; i++) {
        uint64_t gh = i == 0 ? z->gQ : z->gKV;
        if (i < 2)
            ml__ck_accum(ch, b, gqkv);
        ml__ck_node(ch, b, sl[i], gqkv, 0, gh, SIZE_MAX, SIZE_MAX);
        ml__ck_node(ch, b, "ViewBackward0 (head view, contiguous copy)", gh, 0, gh, SIZE_MAX,
                    SIZE_MAX);
    }
}

/* The q/k/v projections: their saved input, weights, and backward nodes. */
static void attn_projections(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                             attn_sizes *z, unsigned src_bpe, bool src_saved, bool fused_qkv,
                             unsigned in_flags)
{
    const unsigned a = ch->prec.a;
    /* q/k/v projections */
    unsigned ncast = fused_qkv ? 1 : 3;
    size_t s_in = SIZE_MAX;
    if (ch->prec.autocast && src_bpe == 4) {
        for (unsigned i = 0; i < ncast; i++)
            ml__ck_save(ch, b, "q/k/v projection input (cast copy)", z->BTD, 2, 0);
    } else if (!src_saved) {
        s_in = ml__ck_save(ch, b, "q/k/v projection input", z->BTD, src_bpe, in_flags);
    }
    ml__ck_weight_copy(ch, b, ml_mul(ch, d->D, z->qkv_out));
    if (fused_qkv) {
        ml__ck_linear(ch, b, d->D, z->qkv_out, m->attn.qkv_bias);
    } else { /* q_proj, k_proj, v_proj: three modules */
        ml__ck_linear(ch, b, d->D, z->Dq, m->attn.qkv_bias);
        ml__ck_linear(ch, b, d->D, d->Dkv, m->attn.qkv_bias);
        ml__ck_linear(ch, b, d->D, d->Dkv, m->attn.qkv_bias);
    }
    ml__ck_tmp(ch, ml_mul(ch, d->BT, z->qkv_out), a);
    /* backward nodes of the projections (docs/ledger.md, "Backward, node by
     * node"): the input's gradient buffer exists already when the input is
     * the block's residual stream (post-norm: the skip holds it); otherwise
     * the first projection gradient to arrive becomes it */
    const unsigned g = ch->prec.grad;
    const bool xbuf = (in_flags & ML_SV_INPUT) != 0;
    uint64_t gBTD = ml_mul(ch, z->BTD, src_bpe);
    z->gQ = ml_mul(ch, z->BTQ, a);
    z->gKV = ml_mul(ch, ml_mul(ch, d->BT, d->Dkv), a);
    if (fused_qkv && (m->attn.fused_proj || m->residual.parallel)) {
        /* Falcon's query_key_value: q a slice, k and v index lists of its
         * output (their IndexBackward0 make zero-filled gradients of the
         * whole output as SliceBackward0 does), rotary, then the matmul's
         * expand over the heads; GPT-NeoX's: chunk's three views, rotary
         * (its pass part an empty slice, as Phi-3's) */
        phi3_projection_nodes(
            ch, b, d, z, gBTD,
            ml_mul(ch, ml_add(ch, ml_mul(ch, d->D, z->qkv_out), m->attn.qkv_bias ? z->qkv_out : 0),
                   g),
            s_in, xbuf);
        rope_repeat_nodes(ch, b, m, d, z);
    } else if (fused_qkv) {
        uint64_t gqkv = ml_mul(ch, ml_mul(ch, d->BT, z->qkv_out), a);
        if (xbuf)
            ml__ck_accum(ch, b, gBTD);
        ml__ck_node(
            ch, b, "AddmmBackward0 (qkv projection)", gBTD,
            ml_mul(ch, ml_add(ch, ml_mul(ch, d->D, z->qkv_out), m->attn.qkv_bias ? z->qkv_out : 0),
                   g),
            gqkv, s_in, SIZE_MAX);
        ml__ck_node(ch, b, "SplitBackward0 (cat of q, k, v)", gqkv, 0,
                    ml_add(ch, z->gQ, ml_mul(ch, 2, z->gKV)), SIZE_MAX, SIZE_MAX);
        ml__ck_node(ch, b, "ViewBackward0 (q, contiguous copy)", z->gQ, 0, z->gQ, SIZE_MAX, SIZE_MAX);
        ml__ck_node(ch, b, "ViewBackward0 (k, contiguous copy)", z->gKV, 0, z->gKV, SIZE_MAX, SIZE_MAX);
    } else {
        /* q, k, v: backward runs v, k, q (the reverse of their creation) */
        static const char *const lin[3] = {"MmBackward0 (q projection)",
                                           "MmBackward0 (k projection)",
                                           "MmBackward0 (v projection)"};
        for (unsigned i = 0; i < 3; i++) {
            uint64_t w_el = i == 0 ? ml_mul(ch, d->D, z->Dq) : ml_mul(ch, d->D, d->Dkv);
            uint64_t gh = i == 0 ? z->gQ : z->gKV;
            if (xbuf || i < 2)
                ml__ck_accum(ch, b, gBTD);
            uint64_t bias_el = m->attn.qkv_bias ? (i == 0 ? z->Dq : d->Dkv) : 0;
            ml__ck_node(ch, b, lin[i], gBTD, ml_mul(ch, ml_add(ch, w_el, bias_el), g), gh,
                        i == 0 ? s_in : SIZE_MAX, SIZE_MAX);
            ml__ck_node(ch, b, "ViewBackward0 (head view, contiguous copy)", gh, 0, gh, SIZE_MAX,
                        SIZE_MAX);
        }
        rope_repeat_nodes(ch, b, m, d, z);
    }
}

/* The attention core: a fused kernel's q, k, v, output and logsumexp, or the
 * eager matmul/softmax layout with its T x T tensors and nodes. */
static void attn_core(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                      const attn_sizes *z, bool causal_mask, bool softmax_fp32)
{
    const unsigned a = ch->prec.a, w = ch->prec.w;
    double attn_core = 4.0 * (double)d->B * (double)d->H * (double)d->T * (double)d->T *
                       (double)d->dh;
    b->flops_fwd += 2.0 * (double)d->BT * (double)d->D * (double)z->qkv_out + attn_core;
    size_t s_pv = SIZE_MAX;
    if (ml__ck_fused_attention(ch, m)) {
        /* scaled_dot_product_attention (flash): saves q, k, v, the output and
         * the per-row logsumexp; no T x T tensor exists */
        ml__ck_save(ch, b, "q, k, v (flash)", ml_mul(ch, d->BT, z->qkv_out), a, 0);
        ml__ck_save(ch, b, "attention output (flash)", z->BTQ, a, 0);
        ml__ck_save(ch, b, "logsumexp (flash)", ml__ck_mul3(ch, d->B, d->H, d->T), 4, 0);
    } else {
        /* matmul of the permuted head views reshapes them into contiguous
         * copies, which bmm saves: q and k for QK^T, v for PV */
        size_t s_qkv = ml__ck_save(ch, b, "q, k, v contiguous copies (bmm)", ml_mul(ch, 3, z->BTQ), a, 0);
        /* Falcon's fp32 mask promotes `scores + mask` to fp32 under autocast */
        ml__ck_tmp(ch, z->BHTT, m->residual.shared_norm && ch->prec.autocast ? 4 : a);
        b->flops_core = attn_core;
        uint64_t gS = ml_mul(ch, z->BHTT, a);
        ml__ck_node(ch, b, "BmmBackward0 (q k^T)", ml_mul(ch, 2, z->gQ), 0, gS, s_qkv, SIZE_MAX);
        ml__ck_node(ch, b, "MulBackward0/DivBackward0 (scale)", gS, 0, gS, SIZE_MAX, SIZE_MAX);
        if (m->attn.softcap > 0 && m->attn.kernel == ML_ATTN_EAGER) {
            /* Gemma 2's scores / cap, tanh, * cap: tanh keeps its result
             * (tanh_backward(grad, result)); the scalar divide and multiply
             * keep a host scalar only. sdpa (transformers passes it no cap)
             * and flash (the kernel caps in place) keep nothing for it */
            size_t s = ml__ck_save(ch, b, "attention softcap tanh output", z->BHTT, a,
                                   ML_SV_CORE);
            ml__ck_node(ch, b, "DivBackward0 (scores / softcap)", gS, 0, gS, SIZE_MAX, SIZE_MAX);
            ml__ck_node(ch, b, "TanhBackward0 (softcap)", gS, 0, gS, s, SIZE_MAX);
            ml__ck_node(ch, b, "MulBackward0 (tanh * softcap)", gS, 0, gS, SIZE_MAX, SIZE_MAX);
        }
        if (causal_mask) {
            size_t s = ml__ck_save(ch, b, "causal mask (masked_fill, bool)",
                                   ml_mul(ch, d->T, d->T), 1, ML_SV_CORE);
            ml__ck_node(ch, b, "MaskedFillBackward0", gS, 0, gS, s, SIZE_MAX);
        }
        unsigned sm = softmax_fp32 ? 4 : w;
        size_t s = ml__ck_save(ch, b, "softmax output", z->BHTT, sm, ML_SV_CORE);
        uint64_t gP = ml_mul(ch, z->BHTT, sm);
        ml__ck_node(ch, b, "SoftmaxBackward0", gS, 0, gP, s, SIZE_MAX);
        if (d->drop) {
            s = ml__ck_save(ch, b, "attention dropout mask", z->BHTT, 1, ML_SV_CORE);
            ml__ck_node(ch, b, "NativeDropoutBackward0 (attention)", gP, 0, gP, s, SIZE_MAX);
        }
        if (sm != a)
            s_pv = ml__ck_save(ch, b, "attention probabilities cast for PV", z->BHTT, a, ML_SV_CORE);
        else if (d->drop)
            s_pv = ml__ck_save(ch, b, "attention dropout output", z->BHTT, sm, ML_SV_CORE);
        if (sm != a)
            ml__ck_node(ch, b, "ToCopyBackward0 (probabilities)", gP, 0, gS, SIZE_MAX, SIZE_MAX);
        ml__ck_node(ch, b, "BmmBackward0 (P v)", ml_add(ch, gS, z->gKV), 0, z->gQ, s_pv, SIZE_MAX);
        ml__ck_node(ch, b, "UnsafeViewBackward0 (attention output)", z->gQ, 0, z->gQ, SIZE_MAX,
                    SIZE_MAX);
    }
}

/* The output projection and the residual dropout. */
static void attn_output(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                        const attn_sizes *z)
{
    const unsigned a = ch->prec.a, g = ch->prec.grad;
    /* output projection: input is the contiguous (B, T, H*dh) attention output */
    size_t s_o = ml__ck_save(ch, b, "output projection input", z->BTQ, a, 0);
    ml__ck_weight_copy(ch, b, ml_mul(ch, z->Dq, d->D));
    bool obias = m->bias || m->attn.out_bias;
    ml__ck_linear(ch, b, z->Dq, d->D, obias);
    b->flops_fwd += 2.0 * (double)d->BT * (double)z->Dq * (double)d->D;
    /* the projection's output feeds the residual add, whose gradient the
     * skip's buffer holds: freed there, not here (or by the dropout, or by
     * Gemma 2's post norm, which made it) */
    uint64_t gD = ml_mul(ch, z->BTD, a);
    ml__ck_node(ch, b, "AddmmBackward0 (output projection)", z->gQ,
                ml_mul(ch, ml_add(ch, ml_mul(ch, z->Dq, d->D), obias ? d->D : 0), g),
                (d->drop || m->residual.post_norms) ? gD : 0, s_o, SIZE_MAX);
    if (d->drop) {
        size_t s = ml__ck_save(ch, b, "residual dropout mask", z->BTD, 1, 0);
        ml__ck_node(ch, b, "NativeDropoutBackward0 (residual)", gD, 0, 0, s, SIZE_MAX);
    }
    ml__ck_tmp(ch, z->BTD, a);
}

void ml__ck_attention(ml_chain *ch, ml_cblock *b, const ml_model *m, const ml_ck_dims *d,
                      unsigned src_bpe, bool src_saved, bool fused_qkv, bool causal_mask,
                      bool softmax_fp32, unsigned in_flags)
{
    attn_sizes z;
    z.BTD = ml_mul(ch, d->BT, d->D);
    /* the queries and the attention output are H heads of dh: D wide unless
     * the model sets a head size (HF head_dim, docs/inventory.md) */
    z.Dq = ml_mul(ch, d->H, d->dh);
    z.BTQ = ml_mul(ch, d->BT, z.Dq);
    z.qkv_out = ml_add(ch, z.Dq, ml_mul(ch, 2, d->Dkv));
    z.BHTT = ml__ck_mul3(ch, d->B, d->H, ml_mul(ch, d->T, d->T));
    attn_projections(ch, b, m, d, &z, src_bpe, src_saved, fused_qkv, in_flags);
    attn_core(ch, b, m, d, &z, causal_mask, softmax_fp32);
    attn_output(ch, b, m, d, &z);
}
