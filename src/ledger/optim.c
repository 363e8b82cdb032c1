/* Optimizer states and step temporaries per torch.optim implementation.
 * Derivations and source files: docs/optimizers.md. */
#include <stdio.h>

#include "ledger/chain.h"
#include "util/error.h"

/* bitsandbytes keeps tensors smaller than min_8bit_size (4096) in 32-bit
 * state, and quantises the rest blockwise (block of 256, one fp32 absmax
 * per block per state). */
#define BNB_MIN_8BIT 4096u
#define BNB_BLOCK 256u

/* Adam's and AdamW's for-loop (`_single_tensor_adam`) binds `denom` in the
 * loop's scope: the previous parameter's denom is freed only when the next
 * one is assigned, so it is alive beside the sqrt and the quotient. */
static bool carries_denom(ml_optimizer o)
{
    return o == ML_OPT_ADAM || o == ML_OPT_ADAMW;
}

/* Whether the step keeps state for parameter p: torch.optim steps the
 * parameters with a gradient (params_with_grad), DeepSpeed's ZeRO every
 * parameter that requires one (its groups are built from requires_grad: a
 * layer whose output nothing reads still has a state); a frozen one neither. */
static bool stepped(const ml_ptensor *p, unsigned zero)
{
    return !p->frozen && (!p->nograd || zero >= 1);
}

/* The for-loop's largest moment, in elements: per parameter, in the order
 * model.parameters() gives them, t_loop temporaries of its size, plus the
 * previous parameter's denom where the loop carries it. */
static uint64_t loop_temp_elems(ml_chain *ch, unsigned t_loop, bool carry, unsigned zero)
{
    uint64_t best = 0, prev = 0;
    for (size_t i = 0; i < ch->nparams; i++) {
        if (!stepped(&ch->params[i], zero))
            continue;
        uint64_t n = ch->params[i].numel;
        uint64_t at = ml_add(ch, ml_mul(ch, n, t_loop), carry ? prev : 0);
        if (at > best)
            best = at;
        prev = n;
    }
    return best;
}

ml_status ml__optim_bytes_of(const ml_chain *ch_const, const ml_training *t, ml_optim_bytes *out,
                             ml_error *err)
{
    ml_chain *ch = (ml_chain *)ch_const; /* only the overflow flag changes */
    const unsigned s = ch->prec.state;
    /* gradients reach a master-weight optimizer in fp32: a converted copy
     * (docs/optimizers.md) */
    const bool master = ch->prec.master != 0;
    /* the parameters stepped() keeps state for */
    const ml_param_sums ps = ml__param_sums(ch);
    const uint64_t P = t->zero >= 1 ? ps.trained : ps.with_grad, maxn = ch->max_param_numel;
    uint64_t states = 0, temp = 0;
    unsigned per = 0;        /* full-size states per parameter */
    /* full-size temporaries: over all parameters at once (foreach) and over
     * the largest tensor (for-loop); docs/optimizers.md derives each */
    unsigned t_foreach = 0, t_loop = 0;
    switch (t->optimizer) {
    case ML_OPT_SGD: per = 0; break;
    case ML_OPT_SGD_MOMENTUM: per = 1; break;
    case ML_OPT_ADAM:
    case ML_OPT_ADAMW: per = 2; t_foreach = 1; t_loop = 2; break; /* sqrt, / bc2 */
    case ML_OPT_LION: per = 1; t_foreach = 2; t_loop = 2; break;  /* clone, add */
    case ML_OPT_ADAFACTOR: per = 0; t_foreach = 1; t_loop = 1; break; /* row @ col */
    case ML_OPT_ADAM_8BIT: per = 0; break;
    default: break;
    }
    if (t->optimizer == ML_OPT_ADAFACTOR && t->optimizer_impl == ML_IMPL_FUSED) {
        return ml__errorf(err, ML_RANGE,
                          "training.optimizer_impl: torch.optim.Adafactor has no fused "
                          "implementation; use for-loop or foreach");
    }
    states = ml_mul(ch, ml_mul(ch, P, per), s);
    if (t->optimizer == ML_OPT_ADAFACTOR) {
        /* factored second moment: a row and a column vector per matrix,
         * the full tensor for vectors; no first moment (beta1 = None) */
        for (size_t i = 0; i < ch->nparams; i++) {
            const ml_ptensor *p = &ch->params[i];
            if (!stepped(p, t->zero))
                continue;
            uint64_t n = p->cols ? ml_add(ch, p->rows, p->cols) : p->numel;
            states = ml_add(ch, states, ml_mul(ch, n, s));
        }
    } else if (t->optimizer == ML_OPT_ADAM_8BIT) {
        for (size_t i = 0; i < ch->nparams; i++) {
            if (!stepped(&ch->params[i], t->zero))
                continue;
            uint64_t n = ch->params[i].numel;
            uint64_t one = n < BNB_MIN_8BIT ? ml_mul(ch, n, 4)
                                            : ml_add(ch, n, ml_mul(ch, (n + BNB_BLOCK - 1) / BNB_BLOCK, 4));
            states = ml_add(ch, states, ml_mul(ch, one, 2));
        }
    }
    switch (t->optimizer_impl) {
    case ML_IMPL_FOREACH:
        temp = ml_mul(ch, ml_mul(ch, P, t_foreach), s);
        if (master)
            temp = ml_add(ch, temp, ml_mul(ch, P, 4));
        break;
    case ML_IMPL_FOR_LOOP:
        temp = ml_mul(ch, loop_temp_elems(ch, t_loop, carries_denom(t->optimizer), t->zero), s);
        if (master)
            temp = ml_add(ch, temp, ml_mul(ch, maxn, 4));
        break;
    case ML_IMPL_FUSED:
    default:
        temp = 0;
        break;
    }
    if (t->optimizer == ML_OPT_ADAM_8BIT)
        temp = 0; /* bitsandbytes updates in one kernel per tensor */
    out->states = states;
    out->step_temp = temp;
    out->state_tensors = per ? per : (states ? 1 : 0);
    out->temp_per_tensor = t->optimizer_impl == ML_IMPL_FOREACH;
    return ML_OK;
}
