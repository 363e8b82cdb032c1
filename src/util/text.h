/* Bounded string joins for the fixed-size names the summary and the
 * reports hold (a phase's `at`, a policy's name). */
#ifndef ML_UTIL_TEXT_H
#define ML_UTIL_TEXT_H

#include <stddef.h>
#include <string.h>

/* dst = a then b, cut to size - 1 bytes as snprintf cuts (nothing written
 * when size is 0); without snprintf's format, as every plan names its
 * phases' peaks and its policy. */
static inline void ml__name_join(char *dst, size_t size, const char *a, const char *b)
{
    if (!size)
        return;
    size_t na = strlen(a), nb = *b ? strlen(b) : 0; /* (b mostly "") */
    if (na >= size)
        na = size - 1;
    if (nb >= size - na)
        nb = size - na - 1;
    memcpy(dst, a, na);
    memcpy(dst + na, b, nb);
    dst[na + nb] = '\0';
}

#endif
