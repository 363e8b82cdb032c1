/* The verdict on a plan that every --emit writer's checks build (refused,
 * or written with notes), and the text helpers the writers share
 * (emit_internal.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "memledger/report.h"
#include "report/emit_internal.h"
#include "report/report_internal.h"

/* s inside a '#' comment of emitted Python or shell: printable ASCII as
 * is, every other byte (a newline would end the comment and start a
 * statement; a stray byte makes the file invalid UTF-8 for Python) and the
 * backslash as \xNN / \\, so the comment stays one line whatever a model
 * file's name: or config.json's _name_or_path holds. */
void ml__emit_comment_text(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '\\')
            fputs("\\\\", f);
        else if (*p < 0x20 || *p >= 0x7f)
            fprintf(f, "\\x%02x", *p);
        else
            fputc(*p, f);
    }
}

bool ml__emit_is_master(ml_precision p)
{
    return p == ML_PREC_BF16_MASTER || p == ML_PREC_FP16_MASTER;
}

bool ml__emit_is_amp(ml_precision p)
{
    return p == ML_PREC_AMP_BF16 || p == ML_PREC_AMP_FP16;
}

/* ---------------------------------------------------------------- verdict */

/* The first refusal is the reason given: the checks run from the most
 * basic (sharding, precision) to the details. */
void ml__emit_refuse(ml_emit_verdict *v, const char *fmt, ...)
{
    if (v->level == ML_EMIT_REFUSED)
        return;
    v->level = ML_EMIT_REFUSED;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->refusal, sizeof v->refusal, fmt, ap);
    va_end(ap);
}

void ml__emit_note(ml_emit_verdict *v, const char *fmt, ...)
{
    if (v->nnotes == EMIT_NOTES)
        return;
    if (v->level == ML_EMIT_EXACT)
        v->level = ML_EMIT_PARTIAL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->notes[v->nnotes++], sizeof v->notes[0], fmt, ap);
    va_end(ap);
}

void ml__emit_allocator_comment(FILE *f, const ml_device *d)
{
    const ml_allocator a = d->allocator;
    const bool allowance = a != ML_ALLOCATOR_NONE && d->fragmentation > 0;
    fprintf(f, "# memledger: allocator %s: %s%s\n", ml_allocator_name(a),
            a == ML_ALLOCATOR_CACHING    ? "PyTorch's default caching allocator, whose reserved "
                                           "peak the verdict holds"
            : a == ML_ALLOCATOR_EXPANDABLE ? "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, "
                                             "whose reserved peak the verdict holds"
                                           : "not simulated: the verdict holds the allocated peak",
            allowance ? " (here the fragmentation allowance's estimate of it, which takes the "
                        "simulation's place)"
                      : "");
}

/* The notes as '#' comment lines. */
void ml__emit_note_comments(FILE *f, const ml_emit_verdict *v)
{
    if (!v->nnotes)
        return;
    fputs("# memledger: part of the plan is not in these settings (exit status 4):\n", f);
    for (size_t i = 0; i < v->nnotes; i++) {
        fputs("# - ", f);
        ml__emit_comment_text(f, v->notes[i]);
        fputc('\n', f);
    }
}
