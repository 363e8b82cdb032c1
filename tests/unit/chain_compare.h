/* Two chains compared field by field: the chain builders' (a) and the op
 * graph's (b) — every block's figures, every saved entry (with names:
 * its name too; the transformer builders word some entries otherwise),
 * every backward node, every parameter, every side tensor and the
 * chain-wide figures; the first difference fails the test with both
 * values (tests/unit/test_graph.c's sequential models, whose builders
 * remain). And a transformer's chain from the graph, whole (chain_whole:
 * test_graph.c, test_graph_heads.c, test_graph_rotln.c). */
#ifndef ML_TEST_CHAIN_COMPARE_H
#define ML_TEST_CHAIN_COMPARE_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "ledger/chain.h"
#include "model/model_internal.h"

#define SAME(f)                                                                          \
    do {                                                                                 \
        if (x->f != y->f)                                                                \
            fail_msg("%s: %s: %s %.17g (builders) != %.17g (graph)", what, who, #f,     \
                     (double)x->f, (double)y->f);                                        \
    } while (0)

/* On a difference, both saved lists (to stderr) before the failure. */
static inline void dump(const ml_chain *a, const ml_chain *b, size_t blk)
{
    for (int k = 0; k < 2; k++) {
        const ml_chain *c = k ? b : a;
        fprintf(stderr, "%s:\n", k ? "graph" : "builders");
        for (size_t i = 0; i < c->blocks[blk].nsaved; i++) {
            const ml_saved *v = &c->saved[c->blocks[blk].saved_first + i];
            fprintf(stderr, "  %-45s %12llu flags %u node %u\n", v->what,
                    (unsigned long long)v->bytes, v->flags, v->node);
        }
    }
}

/* The fused head's norm on a 2-byte stream without autocast (its block
 * followed by the fused loss, whose forward makes the gradients): the
 * graph's backward nodes are a correction decided by PyTorch
 * (tests/torch/fusednorm.py; docs/graph.md): its RMSNorm's middle
 * gradients in fp32 and the casts' ToCopyBackward0 nodes, where the
 * builders counted every gradient in the stream's dtype. Everything else
 * of the block is compared. */
static inline bool fused_norm_corrected(const ml_chain *a, size_t blk)
{
    return !strcmp(a->blocks[blk].name, "head") && a->prec.w == 2 && !a->prec.autocast &&
           blk + 1 < a->n && a->blocks[blk + 1].grads_in_fwd;
}

/* Whether block blk's node lists differ as fused_norm_corrected says. */
static inline bool same_block(const ml_chain *a, const ml_chain *b, size_t blk, bool names,
                       const char *what)
{
    const ml_cblock *x = &a->blocks[blk], *y = &b->blocks[blk];
    const char *who = x->name;
    const bool corrected = fused_norm_corrected(a, blk) && x->nnodes != y->nnodes;
    if (x->nsaved != y->nsaved || x->saved_bytes != y->saved_bytes || x->core_bytes != y->core_bytes)
        dump(a, b, blk);
    if (strcmp(x->name, y->name))
        fail_msg("%s: block %zu is %s and %s", what, blk, x->name, y->name);
    SAME(fwd_phase);
    SAME(ckpt_index);
    SAME(identity);
    SAME(in_held);
    SAME(in_nograd);
    SAME(inplace);
    SAME(nodes_off);
    SAME(measured);
    SAME(cache_bytes);
    SAME(fwd_only);
    SAME(frozen);
    SAME(unused_out);
    SAME(grads_in_fwd);
    SAME(params);
    SAME(nsaved);
    if (!corrected)
        SAME(nnodes);
    SAME(saved_bytes);
    SAME(core_bytes);
    SAME(cast_bytes);
    SAME(in_bytes);
    SAME(in_saved);
    SAME(out_saved);
    SAME(ws_fwd);
    SAME(ws_nograd);
    SAME(ws_bwd);
    SAME(unit_fwd);
    SAME(unit);
    SAME(bwd_in);
    SAME(grad_bytes);
    SAME(grad_accum_bytes);
    SAME(flops_fwd);
    SAME(flops_bwd);
    SAME(flops_core);
    for (size_t i = 0; i < x->nsaved; i++) {
        const ml_saved *u = &a->saved[x->saved_first + i], *v = &b->saved[y->saved_first + i];
        if ((names && strcmp(u->what, v->what)) || u->bytes != v->bytes || u->flags != v->flags ||
            (!corrected && (u->node != v->node || u->next_same != v->next_same)))
            fail_msg("%s: saved[%zu] '%s' %llu B flags %u node %u != '%s' %llu B flags %u "
                     "node %u",
                     what, i, u->what, (unsigned long long)u->bytes, u->flags, u->node, v->what,
                     (unsigned long long)v->bytes, v->flags, v->node);
    }
    for (size_t i = 0; i < x->nnodes && !corrected; i++) {
        const ml_bnode *u = &a->nodes[x->node_first + i], *v = &b->nodes[y->node_first + i];
        if (strcmp(u->what, v->what) || u->grad_in != v->grad_in ||
            u->param_grad != v->param_grad || u->scratch != v->scratch ||
            u->grad_out != v->grad_out || u->first_saved != v->first_saved)
            fail_msg("%s: node[%zu] '%s' != '%s'", what, i, u->what, v->what);
    }
    return corrected;
}

/* The chains equal block by block; returns how many head blocks differ
 * only by the corrected nodes (fused_norm_corrected). */
static inline unsigned same_blocks(const ml_chain *a, const ml_chain *b, bool names, const char *what)
{
    unsigned corrected = 0;
    if (a->n != b->n)
        fail_msg("%s: %zu blocks != %zu", what, a->n, b->n);
    for (size_t i = 0; i < a->n; i++)
        corrected += same_block(a, b, i, names, what);
    const ml_chain *x = a, *y = b;
    const char *who = "the chain";
    SAME(batch_input);
    SAME(batch_targets);
    SAME(buffer_bytes);
    SAME(ckpt_side);
    SAME(n_ckpt);
    SAME(mask_in_forward);
    SAME(nsides);
    if (a->nparams != b->nparams)
        fail_msg("%s: %zu parameter tensors != %zu", what, a->nparams, b->nparams);
    for (size_t i = 0; i < a->nparams; i++)
        if (a->params[i].numel != b->params[i].numel || a->params[i].rows != b->params[i].rows ||
            a->params[i].cols != b->params[i].cols || a->params[i].nograd != b->params[i].nograd ||
            a->params[i].frozen != b->params[i].frozen)
            fail_msg("%s: parameter %zu differs: %llu (%llu x %llu) != %llu (%llu x %llu)", what, i,
                     (unsigned long long)a->params[i].numel, (unsigned long long)a->params[i].rows,
                     (unsigned long long)a->params[i].cols, (unsigned long long)b->params[i].numel,
                     (unsigned long long)b->params[i].rows, (unsigned long long)b->params[i].cols);
    if (a->max_param_numel != b->max_param_numel)
        fail_msg("%s: max_param_numel differs", what);
    for (size_t i = 0; i < a->nsides; i++) {
        const ml_side *u = &a->sides[i], *v = &b->sides[i];
        if ((names && strcmp(u->what, v->what)) || u->bytes != v->bytes || u->from != v->from ||
            u->to != v->to || u->to_bwd != v->to_bwd || u->ckpt_kept != v->ckpt_kept ||
            u->grad != v->grad || u->grad_from != v->grad_from || u->grad_to != v->grad_to)
            fail_msg("%s: side %zu (%s) differs", what, i, u->what);
    }
    return corrected;
}

/* A transformer's chain from the graph, whole: its embedding, its layers
 * ("block.<i>", each with saved tensors, parameters and forward FLOPs), its
 * head and loss last. */
static inline void chain_whole(const ml_chain *b, const ml_model *m, const char *what)
{
    uint64_t layers = 0;
    for (size_t i = 0; i < b->n; i++) {
        const ml_cblock *x = &b->blocks[i];
        if (strncmp(x->name, "block.", 6))
            continue;
        layers++;
        if (!x->nsaved || !x->saved_bytes || !(x->flops_fwd > 0))
            fail_msg("%s: %s is not whole", what, x->name);
    }
    if (b->n < 3 || strcmp(b->blocks[0].name, "embedding") ||
        strcmp(b->blocks[b->n - 1].name, "loss") || layers < m->layers || !b->nparams)
        fail_msg("%s: %zu blocks, %llu layers: not the transformer's whole chain", what, b->n,
                 (unsigned long long)layers);
}

#endif
