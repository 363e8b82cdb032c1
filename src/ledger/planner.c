/* A prepared planner (docs/ledger.md, "A prepared planner"). For each
 * setting (what of the configuration the chain is built from but the
 * micro-batch: ml__chain_key) it builds the model's chain at the powers of
 * two it needs, once; a micro-batch B between 2^k
 * and 2^(k+1) gets the chain on the line through those two builds where a
 * third (2^(k-1) or 2^(k+2)) is on it too (chain_affine.c), and the
 * iteration is replayed over that chain as ml_ledger_evaluate replays a
 * chain it built. Where that does not hold, the evaluation builds its
 * chain; a mixture of experts' chains (not on a line in the micro-batch)
 * are built at their own micro-batch and the last few kept for the other
 * checkpoint policies and ZeRO stages that build the same. The last few
 * settings are kept, so that a search or a grid that returns to a setting
 * finds its builds. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "ledger/chain_affine.h"
#include "ledger/planner.h"
#include "ledger/replay.h"
#include "ledger/steptime.h"
#include "util/error.h"

#define POWERS 26   /* builds at 2^0 .. 2^25 (the largest micro-batch is 2^24) */
#define SETTINGS 8  /* settings kept */
#define EXACT 64    /* builds kept at their own micro-batch (a mixture of experts'): an expert split's, every micro-batch and policy */

typedef struct {
    ml_config key;               /* the setting (ml__chain_key) */
    bool used;
    unsigned long stamp;         /* last use, for eviction */
    signed char built[POWERS];   /* 1: pt[k] built at 2^k; -1: it failed */
    signed char line[POWERS];    /* 1: pt[k-1], pt[k], pt[k+1] on a line; -1: not */
    ml_chain pt[POWERS];
} setting;

/* A chain built at its configuration's own micro-batch, kept for the
 * evaluations that build the same one: the other checkpoint policies (the
 * key holds only whether it is selective) and ZeRO stages (the chain reads
 * them only to refuse, which ml__chain_refused checks first). */
typedef struct {
    ml_config key; /* ml__chain_key, with the micro-batch, without zero */
    bool used;
    unsigned long stamp;
    ml_chain ch;
} exact;

struct ml_planner {
    const ml_model *m;
    setting s[SETTINGS];
    exact x[EXACT];
    unsigned long clock;
    ml_chain at;           /* the chain derived for the micro-batch asked (its
                              arrays reused between evaluations) */
    const setting *at_s;   /* the setting and micro-batch at was derived for, */
    uint64_t at_B;         /* reused by the next evaluation there (another
                              checkpoint policy: the key holds only whether it
                              is selective); NULL: none */
    bool at_work;          /* at has the ops' work items (ml__chain_at) */
    unsigned long derived; /* evaluations over a derived chain */
};

unsigned long ml__planner_derived(const ml_planner *p)
{
    return p->derived;
}

ml_status ml_planner_create(const ml_model *m, ml_planner **out, ml_error *err)
{
    ml_planner *p = calloc(1, sizeof *p);
    if (!p)
        return ml__errorf(err, ML_NOMEM, "out of memory");
    p->m = m;
    *out = p;
    return ML_OK;
}

static void forget(ml_planner *p, setting *s)
{
    if (p->at_s == s)
        p->at_s = NULL;
    for (unsigned k = 0; k < POWERS; k++)
        if (s->built[k] == 1)
            ml__chain_free(&s->pt[k]);
    memset(s, 0, sizeof *s);
}

void ml_planner_destroy(ml_planner *p)
{
    if (!p)
        return;
    for (unsigned i = 0; i < SETTINGS; i++)
        forget(p, &p->s[i]);
    for (unsigned i = 0; i < EXACT; i++)
        if (p->x[i].used)
            ml__chain_free(&p->x[i].ch);
    p->at.params = NULL; /* a build's, borrowed (ml__chain_at) */
    ml__chain_free(&p->at);
    free(p);
}

/* Settings whose chains a builder shapes by the micro-batch (neither
 * affine nor convex): a mixture of experts' rows per expert, the fused
 * cross-entropy's chunks, a calibration profile's scaling by the tokens. */
static bool shaped_by_batch(const ml_model *m, const ml_config *cfg)
{
    return m->moe.experts || cfg->calib || cfg->training.logits == ML_LOGITS_FUSED;
}

/* The setting of key: kept, or the least recently used one made anew. */
static setting *setting_of(ml_planner *p, const ml_config *key)
{
    setting *s = &p->s[0];
    for (unsigned i = 0; i < SETTINGS; i++) {
        if (p->s[i].used && ml__chain_key_equal(&p->s[i].key, key)) {
            s = &p->s[i];
            s->stamp = ++p->clock;
            return s;
        }
        if (!p->s[i].used || p->s[i].stamp < s->stamp)
            s = &p->s[i];
    }
    forget(p, s);
    s->used = true;
    s->stamp = ++p->clock;
    memcpy(&s->key, key, sizeof *key);
    return s;
}

/* pt[k] built (the setting's configuration at micro-batch 2^k). */
static bool have(ml_planner *p, setting *s, const ml_config *cfg, unsigned k)
{
    if (k >= POWERS)
        return false;
    if (!s->built[k]) {
        ml_config c;
        memcpy(&c, cfg, sizeof c);
        c.training.micro_batch = UINT64_C(1) << k;
        ml_error e;
        s->built[k] = ml__chain_build(p->m, &c, &s->pt[k], &e) == ML_OK ? 1 : -1;
    }
    return s->built[k] == 1;
}

/* pt[k-1], pt[k] and pt[k+1] built and on one line. */
static bool on_line(ml_planner *p, setting *s, const ml_config *cfg, unsigned k)
{
    if (k == 0 || k + 1 >= POWERS)
        return false;
    if (!s->line[k]) {
        bool on = have(p, s, cfg, k - 1) && have(p, s, cfg, k) && have(p, s, cfg, k + 1) &&
                  ml__chain_line(&s->pt[k - 1], &s->pt[k], &s->pt[k + 1], UINT64_C(1) << k);
        s->line[k] = on ? 1 : -1;
    }
    return s->line[k] == 1;
}

/* The chain for cfg's micro-batch B from the setting's builds, or NULL
 * (then the caller builds it): pt[k] itself at B = 2^k, else the line
 * through pt[k] and pt[k+1] (2^k < B < 2^(k+1)) where a third build is on
 * it. */
static const ml_chain *chain_for(ml_planner *p, setting *s, const ml_config *cfg,
                                 ml_status *st)
{
    const uint64_t B = cfg->training.micro_batch;
    unsigned k = 0;
    while (k + 1 < 64 && (UINT64_C(1) << (k + 1)) <= B)
        k++;
    if (B == UINT64_C(1) << k)
        return have(p, s, cfg, k) ? &s->pt[k] : NULL;
    /* the ops' work items only where the step time reads them */
    const bool work = ml__step_time_per_op(cfg);
    if (p->at_s == s && p->at_B == B && (p->at_work || !work))
        return &p->at;
    if (!on_line(p, s, cfg, k) && !on_line(p, s, cfg, k + 1))
        return NULL;
    p->at_s = NULL;
    *st = ml__chain_at(&s->pt[k], &s->pt[k + 1], k, B, work, &p->at);
    if (*st != ML_OK)
        return NULL;
    p->at_s = s;
    p->at_B = B;
    p->at_work = work;
    return &p->at;
}

/* The chain of cfg built at its own micro-batch: kept, or built into the
 * least recently used entry; NULL when the build fails (the caller's
 * evaluation then says why). */
static const ml_chain *exact_chain(ml_planner *p, const ml_config *cfg)
{
    ml_config key;
    ml__chain_key(cfg, &key);
    key.training.micro_batch = cfg->training.micro_batch;
    key.training.zero = 0;
    exact *e = &p->x[0];
    for (unsigned i = 0; i < EXACT; i++) {
        exact *x = &p->x[i];
        if (x->used && x->key.training.micro_batch == key.training.micro_batch &&
            ml__chain_key_equal(&x->key, &key)) {
            x->stamp = ++p->clock;
            return &x->ch;
        }
        if (!x->used || x->stamp < e->stamp)
            e = x;
    }
    if (e->used)
        ml__chain_free(&e->ch);
    memset(e, 0, sizeof *e);
    ml_error err;
    if (ml__chain_build(p->m, cfg, &e->ch, &err) != ML_OK)
        return NULL;
    e->used = true;
    e->stamp = ++p->clock;
    memcpy(&e->key, &key, sizeof key);
    return &e->ch;
}

ml_status ml_planner_evaluate(ml_planner *p, const ml_config *cfg, bool keep_events,
                              ml_ledger **out, ml_error *err)
{
    return ml__planner_evaluate_with(p, cfg, keep_events, NULL, out, err);
}

ml_status ml__planner_evaluate_with(ml_planner *p, const ml_config *cfg, bool keep_events,
                                    ml_reserved_memo *memo, ml_ledger **out, ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    ml__error_clear(err);
    ml_status st = ml_config_check(cfg, err);
    if (st)
        return st;
    if (shaped_by_batch(p->m, cfg)) {
        /* a mixture of experts' chain, built exactly and kept */
        if (cfg->calib || cfg->training.logits == ML_LOGITS_FUSED)
            return ml_ledger_evaluate(p->m, cfg, keep_events, out, err);
        if ((st = ml__chain_refused(p->m, &cfg->training, err)))
            return st;
        const ml_chain *ch = exact_chain(p, cfg);
        if (!ch)
            return ml_ledger_evaluate(p->m, cfg, keep_events, out, err);
        return ml__evaluate_chain(p->m, cfg, ch, keep_events, false, memo, out, err);
    }
    /* the key holds the policy only as selective or not: its checks first */
    if ((st = ml__chain_refused(p->m, &cfg->training, err)))
        return st;
    ml_config key;
    ml__chain_key(cfg, &key);
    setting *s = setting_of(p, &key);
    const ml_chain *ch = chain_for(p, s, cfg, &st);
    if (st == ML_NOMEM)
        return ml__errorf(err, ML_NOMEM, "out of memory");
    if (!ch)
        return ml_ledger_evaluate(p->m, cfg, keep_events, out, err);
    p->derived++;
    return ml__evaluate_chain(p->m, cfg, ch, keep_events, false, memo, out, err);
}
