/* UTF-8 for the JSON writers: JSON text is UTF-8 (RFC 8259, section 8.1),
 * and a name from the input (a file path, a model's name) may hold bytes
 * that are not. */
#ifndef ML_UTIL_UTF8_H
#define ML_UTIL_UTF8_H

#include <stddef.h>
#include <stdio.h>

/* 3 when text[0 .. len) starts with a UTF-8 byte order mark (EF BB BF),
 * which the CSV readers skip, else 0. */
static inline size_t ml_utf8_bom_len(const char *text, size_t len)
{
    return len >= 3 && (unsigned char)text[0] == 0xEF && (unsigned char)text[1] == 0xBB &&
                   (unsigned char)text[2] == 0xBF
               ? 3
               : 0;
}

/* The length of the well-formed UTF-8 sequence that starts at p (1 to 4,
 * RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF), or
 * 0 when the bytes there are not one. p is NUL-terminated; a NUL ends any
 * sequence. */
static inline size_t ml_utf8_len(const unsigned char *p)
{
    unsigned c = p[0];
    if (c < 0x80)
        return 1;
    size_t n = c >= 0xC2 && c <= 0xDF   ? 2
               : c >= 0xE0 && c <= 0xEF ? 3
               : c >= 0xF0 && c <= 0xF4 ? 4
                                        : 0;
    if (!n)
        return 0;
    /* the second byte's range narrows for E0, ED, F0 and F4 */
    unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
    unsigned hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if ((p[i] & 0xC0) != 0x80)
            return 0;
    return n;
}

/* s as a JSON string, quotes included: '"' and '\\' escaped, control bytes
 * as \\u00XX, a byte that is not UTF-8 as U+FFFD (the replacement
 * character), so that the output stays UTF-8 whatever a name holds. */
static inline void ml_json_put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        size_t n = ml_utf8_len(p);
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else if (!n)
            fputs("\\ufffd", f);
        else
            fwrite(p, 1, n, f);
        p += n ? n : 1;
    }
    fputc('"', f);
}

#endif
