/* fit's explanation of a miss: why micro-batch 1 does not fit, and what
 * would help (docs/choosing.md): a shorter sequence, sharding, a list of
 * blocks to checkpoint, a smaller evaluation batch. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ledger/chain.h"
#include "plan/fit_search.h"
#include "util/error.h"

/* Whether c (micro-batch 1, full checkpointing) fits; ML_NOMEM passes up,
 * another failure is "does not fit". */
static ml_status fits_with(search *s, const ml_config *c, bool *fits)
{
    ml_ledger *l = NULL;
    ml_status st = ml__planner_evaluate_with(s->planner, c, false, s->memo, &l, s->err);
    *fits = st == ML_OK && ml_ledger_summary(l)->fits;
    ml_ledger_destroy(l);
    return st == ML_NOMEM ? st : ML_OK;
}

/* The longest seq_len below the configured one at which micro-batch 1
 * fits (bisection: the peak grows with T), or 0; in steps of 2 cp tokens
 * with context parallelism (the lengths its ring splits). */
static ml_status longest_seq(search *s, uint64_t *out)
{
    ml_config c = s->cfg;
    const uint64_t q = c.training.context_parallel > 1 ? 2 * c.training.context_parallel : 1;
    uint64_t lo = 0, hi = c.training.seq_len / q; /* in steps of q: fits at lo (0: none
                                                     yet), not at hi */
    bool ok = false;
    *out = 0;
    c.training.seq_len = q;
    ml_status st = hi > 1 ? fits_with(s, &c, &ok) : ML_OK;
    if (st || !ok)
        return st;
    lo = 1;
    while (hi - lo > 1) {
        const uint64_t mid = lo + (hi - lo) / 2;
        c.training.seq_len = mid * q;
        if ((st = fits_with(s, &c, &ok)))
            return st;
        *(ok ? &lo : &hi) = mid;
    }
    *out = lo * q;
    return ML_OK;
}

/* The sharding that would make micro-batch 1 fit with full checkpointing:
 * ZeRO-3 over the devices there are (when not sharded fully yet), else over
 * the fewest more of them, in powers of two up to training.data_parallel's
 * limit; "" when sharding cannot help (a single device's share still does
 * not fit). */
static ml_status shard_fix(search *s, char *out, size_t size)
{
    ml_config c = s->cfg;
    const uint64_t dp = c.training.data_parallel;
    /* the states shard over dp x cp ranks */
    const uint64_t cp = ml_training_cp(&c.training);
    const bool sharded = c.training.zero == 3;
    uint64_t lo = 1, hi = 1;
    ml_config_range("training.data_parallel", &lo, &hi);
    out[0] = '\0';
    c.training.zero = 3;
    uint64_t first = sharded || dp * cp < 2 ? 2 : dp;
    while (first <= dp && sharded)
        first *= 2;
    /* 4,096 devices at most, or 8x what the run has (the search is the
     * note's, on a configuration that already does not fit) */
    const uint64_t most = dp >= 512 && dp * 8 < hi ? dp * 8 : dp >= 512 ? hi : 4096;
    for (uint64_t n = first; n <= most; n *= 2) {
        c.training.data_parallel = n;
        bool fits = false;
        ml_status st = fits_with(s, &c, &fits);
        if (st)
            return st;
        if (fits) {
            if (sharded || n > dp)
                snprintf(out, size, "shard (ZeRO-3) across %llu devices "
                                    "(training.data_parallel %llu, training.zero 3)",
                         (unsigned long long)(n * cp), (unsigned long long)n);
            else
                snprintf(out, size, "shard the model states fully over the %llu devices "
                                    "(training.zero 3)",
                         (unsigned long long)(n * cp));
            return ML_OK;
        }
    }
    return ML_OK;
}

/* The single changes that make micro-batch 1 (full checkpointing) fit,
 * each planned, as one "a, b, or c" phrase in list. */
static ml_status fix_list(search *s, bool states_alone, char *list, size_t size)
{
    ml_status st;
    char fixes[4][192];
    size_t nf = 0;
    ml_config c = s->cfg;
    bool ok = false;
    uint64_t tmax = 0;
    if (!states_alone && (st = longest_seq(s, &tmax)))
        return st;
    if (tmax)
        snprintf(fixes[nf++], sizeof fixes[0], "shorten seq_len to %llu (training.seq_len)",
                 (unsigned long long)tmax);
    c.training.precision = ML_PREC_BF16;
    if (s->cfg.training.precision != ML_PREC_BF16 && (st = fits_with(s, &c, &ok)))
        return st;
    if (ok)
        snprintf(fixes[nf++], sizeof fixes[0], "keep the parameters in bf16 "
                                               "(training.precision bf16)");
    if ((st = shard_fix(s, fixes[nf], sizeof fixes[0])))
        return st;
    nf += fixes[nf][0] != '\0';
    c = s->cfg;
    c.training.offload = ML_OFFLOAD_OPTIMIZER;
    ok = false;
    if (s->cfg.training.offload == ML_OFFLOAD_NONE && (st = fits_with(s, &c, &ok)))
        return st;
    if (ok)
        snprintf(fixes[nf++], sizeof fixes[0], "offload the optimizer (training.offload "
                                               "optimizer)");
    for (size_t k = 0; k < nf; k++) {
        size_t len = strlen(list);
        snprintf(list + len, size - len, "%s%s",
                 k == 0 ? "" : k + 1 == nf ? (nf > 2 ? ", or " : " or ") : ", ", fixes[k]);
    }
    if (!nf)
        snprintf(list, size, "no single change makes it fit (memledger triage ranks "
                                    "them); combine them, or a larger device");
    return ML_OK;
}

/* With an evaluation pass (training.eval_batch): whether it is what does not
 * fit, the training iteration alone fitting at c (micro-batch 1, full
 * checkpointing); then *largest gets the largest evaluation batch that fits
 * beside it (bisection: the pass's peak grows with its batch), 0 if none. */
static ml_status eval_binds(search *s, const ml_config *c, bool *binds, uint64_t *largest)
{
    *binds = false;
    *largest = 0;
    if (!c->training.eval_batch)
        return ML_OK;
    ml_config t = *c;
    t.training.eval_batch = 0;
    t.training.eval_seq_len = 0;
    bool ok = false;
    ml_status st = fits_with(s, &t, &ok);
    if (st || !ok)
        return st;
    *binds = true;
    uint64_t lo = 0, hi = c->training.eval_batch; /* fits at lo (0: none yet), not at hi */
    t = *c;
    while (hi - lo > 1) {
        t.training.eval_batch = lo + (hi - lo) / 2;
        if ((st = fits_with(s, &t, &ok)))
            return st;
        *(ok ? &lo : &hi) = t.training.eval_batch;
    }
    *largest = lo;
    return ML_OK;
}

/* The note when the evaluation pass is what does not fit. */
static void eval_note(const ml_config *c, const ml_summary *x, uint64_t largest, char *note,
                      size_t size)
{
    char a[32], b[32], d[32];
    ml_format_bytes(x->peak_eval, a, sizeof a);
    ml_format_bytes(x->budget, b, sizeof b);
    ml_format_bytes(x->memory, d, sizeof d);
    int n = snprintf(note, size,
                     "the evaluation pass does not fit: at evaluation batch %llu its peak is %s "
                     "against the budget %s (device %s), whatever the training micro-batch; ",
                     (unsigned long long)c->training.eval_batch, a, b, d);
    if (n < 0 || (size_t)n >= size)
        return;
    if (largest)
        snprintf(note + n, size - (size_t)n,
                 "the largest evaluation batch that fits is %llu (training.eval_batch %llu)",
                 (unsigned long long)largest, (unsigned long long)largest);
    else
        snprintf(note + n, size - (size_t)n,
                 "even evaluation batch 1 does not fit: shorten the evaluation's sequence "
                 "(training.eval_seq_len)");
}

ml_status ml__fit_explain(search *s, ml_fit_result *r)
{
    char a[32], b[32];
    /* the accumulation stays the search's (fit: with it, the gradients stay
     * resident across micro-batches): every remedy must hold for the run
     * asked about */
    const bool was_full = s->cfg.training.checkpoint.kind == ML_CKPT_FULL;
    s->cfg.training.micro_batch = 1;
    s->cfg.training.checkpoint.kind = ML_CKPT_FULL;
    ml_ledger *l = NULL;
    ml_status st = ml__planner_evaluate_with(s->planner, &s->cfg, false, s->memo, &l, s->err);
    if (st == ML_NOMEM)
        return st;
    if (st == ML_OVERFLOW) {
        /* not a verdict on the device: no micro-batch, checkpointing or
         * sharding makes the counts fit in 64 bits */
        snprintf(r->note, sizeof r->note,
                 "even micro-batch 1 cannot be planned: at seq_len %llu, with full "
                 "checkpointing, its byte counts exceed 64 bits (over 16 EiB), whatever the "
                 "device; shorten seq_len or make the model smaller",
                 (unsigned long long)s->cfg.training.seq_len);
        return ML_OK;
    }
    if (st) {
        snprintf(r->note, sizeof r->note, "even micro-batch 1 cannot be planned: %s",
                 s->err->msg);
        return ML_OK;
    }
    const ml_summary *x = ml_ledger_summary(l);
    if (!x->fits && x->binding == ML_PEAK_EVAL) {
        /* the evaluation batch, not the training, may be what does not fit */
        bool binds = false;
        uint64_t largest = 0;
        if ((st = eval_binds(s, &s->cfg, &binds, &largest))) {
            ml_ledger_destroy(l);
            return st;
        }
        if (binds) {
            eval_note(&s->cfg, x, largest, r->note, sizeof r->note);
            ml_ledger_destroy(l);
            return ML_OK;
        }
    }
    uint64_t states = x->bytes_params + x->bytes_master + x->bytes_grads + x->bytes_optimizer;
    ml_format_bytes(states, a, sizeof a);
    ml_format_bytes(x->budget, b, sizeof b);
    bool states_alone = states > x->budget || states + x->runtime_reserve > x->memory;
    const bool full_fits = x->fits;
    ml_ledger_destroy(l);
    if (full_fits && !was_full) {
        /* the configured policy keeps too much: checkpointing is the remedy */
        snprintf(r->note, sizeof r->note,
                 "micro-batch 1 does not fit with the plan's checkpointing, but does with full "
                 "checkpointing (training.checkpoint full), or let fit choose the policy "
                 "(training.checkpoint auto)");
        return ML_OK;
    }
    char list[800] = "";
    if ((st = fix_list(s, states_alone, list, sizeof list)))
        return st;
    if (states_alone)
        snprintf(r->note, sizeof r->note,
                 "model states alone need %s per device (params, grads, optimizer states) "
                 "against a budget of %s: checkpointing cannot help; %s",
                 a, b, list);
    else
        snprintf(r->note, sizeof r->note,
                 "micro-batch 1 does not fit even with full checkpointing (model states %s, "
                 "budget %s): %s",
                 a, b, list);
    return ML_OK;
}
