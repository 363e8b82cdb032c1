/* Filling an ml_error, and reading an input file whole: the two things
 * every layer's error path needs, without the YAML tree (model/tree.h adds
 * positions in a document). */
#ifndef ML_UTIL_ERROR_H
#define ML_UTIL_ERROR_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#include "memledger/error.h"

/* The largest input file any loader reads. */
#define ML_INPUT_MAX_BYTES (16u << 20)

/* err as no error: no code, path, position or message (the strings
 * emptied rather than their 1 KiB cleared, for the callers a search or a
 * grid calls for each configuration). */
static inline void ml__error_clear(ml_error *err)
{
    err->code = ML_OK;
    err->path[0] = '\0';
    err->line = err->col = 0;
    err->msg[0] = '\0';
}

/* Sets err (code, no position, a formatted message) and returns code. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
ml_status ml__errorf(ml_error *err, ml_status code, const char *fmt, ...);

/* Sets err's code, position (line and column, 1-based; 0 for none) and
 * formatted message, leaving its path; accepts a NULL err. Returns code. */
#if defined(__GNUC__)
__attribute__((format(printf, 5, 6)))
#endif
ml_status ml__errorf_at(ml_error *err, ml_status code, unsigned line, unsigned col,
                        const char *fmt, ...);
ml_status ml__verrorf_at(ml_error *err, ml_status code, unsigned line, unsigned col,
                         const char *fmt, va_list ap);

/* A message that opens with `from` opens with `to` instead (a key renamed
 * for the caller's words); any other message, or a NULL err, is left. */
void ml__error_reword(ml_error *err, const char *from, const char *to);

/* Reads a whole input file (at most ML_INPUT_MAX_BYTES). Starts err afresh,
 * naming the file in err->path (so every loader's messages name it). Returns
 * a buffer the caller frees, or NULL with err's code and message set (ML_IO,
 * ML_RANGE, ML_NOMEM). */
char *ml__read_file(const char *path, size_t *len, ml_error *err);

/* Whether path names a folder, or a regular file (false where it names
 * anything else or nothing). */
bool ml__is_folder(const char *path);
bool ml__is_file(const char *path);

/* A Hugging Face model's folder, path, as its config.json: path/config.json
 * written into out (room bytes) and returned when path is a folder, path
 * itself otherwise (or when the joined name would not fit). */
const char *ml__hf_config_in(const char *path, char *out, size_t room);

#endif
