/* The model file's Gemma 2 keys (schema.c calls this after the other
 * transformer keys): post_norms, attn_scalar, attn_softcap, final_softcap
 * (docs/cli.md, "The model file"; what each changes: docs/inventory.md,
 * "Gemma 2 block"). Each is refused with its position where the chain
 * cannot build it. */
#include "model/schema.h"

ml_status ml__schema_gemma2(ml_error *err, const ml_node *mm, ml_model *m)
{
    ml_status st;
    if ((st = ml__tree_bool(err, mm, "post_norms", "model", &m->residual.post_norms)) ||
        (st = ml__tree_double(err, mm, "attn_scalar", "model", 0, 1e12, false, &m->attn.scalar)) ||
        (st = ml__tree_double(err, mm, "attn_softcap", "model", 0, 1e12, false,
                              &m->attn.softcap)) ||
        (st = ml__tree_double(err, mm, "final_softcap", "model", 0, 1e12, false,
                              &m->head.final_softcap)))
        return st;
    const bool dec = m->type == ML_MODEL_DECODER;
    /* the op graph builds them in Gemma 2's layer only (its norms,
     * src/graph/families.c: ml__family_gemma_layer) */
    const bool gemma = m->norms.kind == ML_NORM_GEMMA_RMSNORM;
    if (m->residual.post_norms &&
        (!dec || !m->residual.prenorm || m->residual.parallel || !gemma || m->dropout > 0))
        return ml__error_at(err, ml__tree_get(mm, "post_norms"), ML_SCHEMA,
                            "model.post_norms: Gemma 2's norms on the attention and MLP outputs "
                            "are planned in Gemma 2's layer: a pre-norm decoder with norm: "
                            "gemma_rmsnorm, no parallel_residual and dropout: 0 (its layer has "
                            "no dropout)");
    if (m->attn.softcap > 0 && (!dec || !gemma))
        return ml__error_at(err, ml__tree_get(mm, "attn_softcap"), ML_SCHEMA,
                            "model.attn_softcap: Gemma 2's soft-capped scores are planned in "
                            "Gemma 2's layer: a decoder with norm: gemma_rmsnorm");
    if (m->head.final_softcap > 0 && !dec)
        return ml__error_at(err, ml__tree_get(mm, "final_softcap"), ML_SCHEMA,
                            "model.final_softcap: soft-caps the LM logits of a decoder (type: "
                            "decoder)");
    return ML_OK;
}
