/* Reading an input file whole, with the size limit every parser shares;
 * ml__errorf. */
#include <errno.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "util/error.h"

char *ml__read_file(const char *path, size_t *len, ml_error *err)
{
    memset(err, 0, sizeof *err);
    snprintf(err->path, sizeof err->path, "%s", path);
    FILE *f = fopen(path, "rb");
    if (!f) {
        err->code = ML_IO;
        err->line = err->col = 0;
        snprintf(err->msg, sizeof err->msg, "cannot open: %s", strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    bool too_big = false;
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        if (n > ML_INPUT_MAX_BYTES) {
            too_big = true;
            break;
        }
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    too_big = too_big || n > ML_INPUT_MAX_BYTES; /* a file that ended past the limit */
    bool bad = ferror(f) != 0;
    int why = errno; /* e.g. EISDIR: a folder opens, but reading it fails */
    fclose(f);
    if (!buf || bad || too_big) {
        const bool nomem = !buf;
        free(buf);
        err->code = nomem ? ML_NOMEM : too_big ? ML_RANGE : ML_IO;
        err->line = err->col = 0;
        if (!nomem && !too_big && ml__is_folder(path))
            snprintf(err->msg, sizeof err->msg, "a folder, not a file");
        else
            snprintf(err->msg, sizeof err->msg, "%s%s",
                     nomem ? "out of memory" : too_big ? "file larger than 16 MiB" : "cannot read: ",
                     nomem || too_big ? "" : strerror(why));
        return NULL;
    }
    *len = n;
    return buf;
}

bool ml__is_folder(const char *path)
{
    struct stat st;
    return path && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool ml__is_file(const char *path)
{
    struct stat st;
    return path && stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

const char *ml__hf_config_in(const char *path, char *out, size_t room)
{
    if (!ml__is_folder(path))
        return path;
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    int w = snprintf(out, room, "%.*s/config.json", (int)n, path);
    return w > 0 && (size_t)w < room ? out : path;
}

ml_status ml__errorf(ml_error *err, ml_status code, const char *fmt, ...)
{
    err->code = code;
    err->line = err->col = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

void ml__error_reword(ml_error *err, const char *from, const char *to)
{
    size_t n = strlen(from);
    if (!err || strncmp(err->msg, from, n))
        return;
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s%s", to, err->msg + n);
    snprintf(err->msg, sizeof err->msg, "%s", msg);
}

ml_status ml__verrorf_at(ml_error *err, ml_status code, unsigned line, unsigned col,
                         const char *fmt, va_list ap)
{
    if (!err)
        return code;
    err->code = code;
    err->line = line;
    err->col = col;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    return code;
}

ml_status ml__errorf_at(ml_error *err, ml_status code, unsigned line, unsigned col,
                        const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ml__verrorf_at(err, code, line, col, fmt, ap);
    va_end(ap);
    return code;
}
