/* memledger — status codes and the error record every fallible call fills. */
#ifndef MEMLEDGER_ERROR_H
#define MEMLEDGER_ERROR_H

#include "export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One list makes the enum, the names and the short messages (libuv's
 * UV_ERRNO_MAP habit), so they can never drift apart. */
#define ML_STATUS_MAP(X)                                                     \
    X(OK, "ok")                                                              \
    X(IO, "cannot read or write a file")                                     \
    X(SYNTAX, "malformed YAML")                                              \
    X(SCHEMA, "invalid model description")                                   \
    X(RANGE, "value out of range")                                           \
    X(OVERFLOW, "a byte or FLOP count does not fit in 64 bits")              \
    X(NOMEM, "out of memory")                                                \
    X(USAGE, "bad argument")

typedef enum ml_status {
#define ML_STATUS_ENUM_(name, msg) ML_##name,
    ML_STATUS_MAP(ML_STATUS_ENUM_)
#undef ML_STATUS_ENUM_
    ML_STATUS_COUNT
} ml_status;

/* Where a problem is and what it is. line and col are 1-based; 0 means
 * "not tied to a position" (for example a command-line override). */
typedef struct ml_error {
    ml_status code;
    char path[512];
    unsigned line;
    unsigned col;
    char msg[512];
} ml_error;

/* "ML_SCHEMA" style name of a status; never NULL. */
ML_API const char *ml_status_name(ml_status s);
/* Short human description of a status; never NULL. */
ML_API const char *ml_status_message(ml_status s);

#ifdef __cplusplus
}
#endif
#endif
