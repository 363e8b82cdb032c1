/* Decimal numbers, as every reader of a number takes them (the model file,
 * config.json, the flags, the library's setters). */
#ifndef ML_UTIL_DECIMAL_H
#define ML_UTIL_DECIMAL_H

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* The whole of s as a finite decimal number into *out (strtod's reading),
 * without what strtod takes beyond decimal notation: hexadecimal ("0x10",
 * "0x1p5"), "inf" and "nan". False, *out untouched, when s is not one or
 * overflows. */
static inline bool ml__decimal(const char *s, double *out)
{
    if (!s || !*s || strpbrk(s, "xXiInN"))
        return false;
    char *end = NULL;
    errno = 0;
    const double v = strtod(s, &end);
    if (end == s || *end || errno == ERANGE || !isfinite(v))
        return false;
    *out = v;
    return true;
}

#endif
