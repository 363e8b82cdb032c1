/* The chain's writing kit (chain_kit.h): checked arithmetic, the precision
 * table, block bookkeeping (saved tensors, parameters, backward nodes, the
 * block rule's transients). The op graph's passes (chain_graph.c) write
 * every block through it; what each op keeps is the graph's (src/graph/,
 * docs/inventory.md). */
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

/* Notes a tensor's size for the block's transient estimate. */
static void note(ml_chain *ch, uint64_t bytes, bool saved)
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
        note(ch, bytes, true);
        return SIZE_MAX;
    }
    if (flags & ML_SV_INPUT) {
        /* the block's input is a boundary tensor, accounted by the replay */
        b->in_saved = true;
        note(ch, bytes, true);
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
    if (flags & ML_SV_WCAST)
        b->cast_bytes = ml_add(ch, b->cast_bytes, bytes);
    note(ch, bytes, true);
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
    *n = (ml_bnode){.what = what,
                    .grad_in = grad_in,
                    .param_grad = param_grad,
                    .grad_out = grad_out,
                    .first_saved = ML_NODE_NONE};
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

ml_bnode *ml__ck_last_node(ml_chain *ch, ml_cblock *b)
{
    return ch->record_nodes && !ch->overflow && !ch->nomem && b->nnodes
               ? &ch->nodes[ch->nnodes - 1]
               : NULL;
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
        b->nodes_off) {
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
    note(ch, ml_mul(ch, elems, bpe), false);
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
    ch->params[ch->nparams++] = (ml_ptensor){numel, cols ? rows : 0, cols, false, false, false};
    b->params = ml_add(ch, b->params, numel);
    if (numel > ch->max_param_numel)
        ch->max_param_numel = numel;
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

void ml__ck_ng_close(ml_cblock *b, const ml_graph_live *g, uint64_t out, uint64_t kept)
{
    if (!g->bad && g->live >= kept && g->live - kept == out && g->peak >= out) {
        b->ws_nograd = g->peak - out;
        b->ws_nograd_ops = true;
    }
}

void ml__ck_grad_close(ml_cblock *b, const ml_graph_live *g, uint64_t out)
{
    uint64_t end = b->saved_bytes + out; /* end < out: the sum wrapped */
    if (!g->bad && end >= out && g->live == end && g->peak >= end) {
        b->ws_fwd = g->peak - end;
        b->ws_fwd_ops = true;
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
bool ml__ck_fused_attention(unsigned compute_bytes, const ml_model *m)
{
    if (m->attn.kernel == ML_ATTN_SDPA)
        return !((compute_bytes == 4 || m->residual.shared_norm) &&
                 m->attn.kv_heads < m->attn.heads);
    return m->attn.kernel == ML_ATTN_FLASH;
}

void ml__ck_op_scratch(ml_chain *ch, ml_cblock *b, const ml_ck_graph *G, const mlg_op *o,
                       const uint64_t *tb, ml_bnode *nn)
{
    const ml_graph *g = &G->g;
    const uint64_t own = o->ngin ? ml_mul(ch, tb[o->gin[0]], o->scratch_in) : 0;
    uint64_t scratch = own;
    /* sequence parallelism's collectives in the backward (Megatron,
     * tensor_parallel/layers.py and mappings.py): a column-parallel op
     * computes its input's whole gradient, then reduce-scatters it into
     * the shard; a row-parallel op gathers its output's gradient whole */
    if (o->sp_site == MLG_SP_COLUMN && o->ngin)
        scratch = ml_add(ch, scratch, ml_mul(ch, tb[o->gin[0]], g->seq_div));
    else if (o->sp_site == MLG_SP_ROW && o->nout)
        scratch = ml_add(ch, scratch, ml_mul(ch, tb[o->out[0]], g->seq_div));
    /* ring attention's backward: its buffers (context_parallel.c) */
    if (o->kind == MLG_OP_ATTENTION)
        scratch = ml_add(ch, scratch, ml__cp_ring_backward(ch, &G->z));
    if (!scratch)
        return;
    ml__ck_node_scratch(ch, b, scratch);
    /* the simulation makes a formula's temporaries one by one, the same
     * size each, where nothing above added to them */
    if (nn) {
        const bool parts = scratch == own && !o->scratch_one && o->scratch_in <= ML_SCRATCH_PARTS;
        nn->scratch_parts = parts ? o->scratch_in : 1;
        nn->scratch_first = o->scratch_first;
        nn->scratch_early =
            parts && o->scratch_first && o->scratch_early < o->scratch_in ? o->scratch_early : 0;
    }
}
