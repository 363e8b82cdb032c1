/* Private to --emit (emit.c, emit_torch.c): the verdict on a plan that the
 * checks build, what the plan checkpoints, and the helpers both writers
 * use. */
#ifndef ML_EMIT_INTERNAL_H
#define ML_EMIT_INTERNAL_H

#include <stdbool.h>
#include <stdio.h>

#include "memledger/report.h"

#define EMIT_NOTES 8

typedef struct {
    int level; /* ML_EMIT_EXACT, ML_EMIT_PARTIAL or ML_EMIT_REFUSED */
    char refusal[640];
    char notes[EMIT_NOTES][480];
    size_t nnotes;
} ml_emit_verdict;

/* What the plan checkpoints, read from the ledger (the policy resolved:
 * `optimal` and `every-K` become their segments). */
typedef struct {
    size_t blocks;     /* repeated blocks (those with a checkpoint index) */
    size_t ckpt;       /* of which checkpointed */
    size_t segments;   /* checkpoint segments */
    bool selective;    /* the attention core only, inside each block */
} ml_ckpt_shape;

#if defined(__GNUC__)
#define ML_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define ML_PRINTF(a, b)
#endif

/* Refuses the plan; the first refusal is the reason given, so the checks
 * run from the most basic (sharding, precision) to the details. */
void ML_PRINTF(2, 3) ml__emit_refuse(ml_emit_verdict *v, const char *fmt, ...);
/* A part of the plan the settings cannot hold: the plan becomes partial
 * (unless refused); notes past EMIT_NOTES are dropped. */
void ML_PRINTF(2, 3) ml__emit_note(ml_emit_verdict *v, const char *fmt, ...);
/* The notes as '#' comment lines (nothing when there is none). */
void ml__emit_note_comments(FILE *f, const ml_emit_verdict *v);
/* A '#' comment line naming the allocator the plan assumed (emit.c). */
void ml__emit_allocator_comment(FILE *f, const ml_device *d);
/* s inside a '#' comment of emitted Python or shell, escaped to stay one
 * line of printable ASCII. */
void ml__emit_comment_text(FILE *f, const char *s);
/* bf16-master or fp16-master; amp-bf16 or amp-fp16. */
bool ml__emit_is_master(ml_precision p);
bool ml__emit_is_amp(ml_precision p);
/* The checkpoint segments as "(first, last)" pairs of checkpoint indices. */
void ml__emit_print_segments(FILE *f, const ml_ledger *l);

/* --emit megatron (emit_megatron.c): pretrain_gpt.py's arguments; the
 * checks, and the arguments (0, or -1 on a write error). */
void ml__emit_megatron_check(ml_emit_verdict *v, const ml_model *m, const ml_config *cfg);
int ml__emit_megatron(FILE *f, const ml_model *m, const ml_config *cfg, const ml_emit_verdict *v);

/* --emit torchtitan (emit_torchtitan.c): a torchtitan v0.2.2 job config
 * (TOML); the checks (l: the plan's ledger, for its checkpointed layers),
 * and the config (0, or -1 on a write error). */
void ml__emit_torchtitan_check(ml_emit_verdict *v, const ml_model *m, const ml_config *cfg,
                               const ml_ledger *l);
int ml__emit_torchtitan(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l,
                        const ml_emit_verdict *v);

/* --emit torch (emit_torch.c): the checks of a one-device PyTorch loop, and
 * the loop; returns 0, or -1 on a write error. */
void ml__emit_torch_check(ml_emit_verdict *v, const ml_training *t, ml_ckpt_shape s);
int ml__emit_torch(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l,
                   const ml_emit_verdict *v);

#endif
