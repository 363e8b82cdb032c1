#include <stdarg.h>
#include <stdio.h>

#include "model/tree.h"

static const char *const names[] = {
#define ML_STATUS_NAME_(name, msg) "ML_" #name,
    ML_STATUS_MAP(ML_STATUS_NAME_)
#undef ML_STATUS_NAME_
};

static const char *const messages[] = {
#define ML_STATUS_MSG_(name, msg) msg,
    ML_STATUS_MAP(ML_STATUS_MSG_)
#undef ML_STATUS_MSG_
};

const char *ml_status_name(ml_status s)
{
    return (unsigned)s < ML_STATUS_COUNT ? names[s] : "ML_UNKNOWN";
}

const char *ml_status_message(ml_status s)
{
    return (unsigned)s < ML_STATUS_COUNT ? messages[s] : "unknown status";
}

ml_status ml__error_at(ml_error *err, const ml_node *at, ml_status code, const char *fmt, ...)
{
    err->code = code;
    err->line = at ? at->line : 0;
    err->col = at ? at->col : 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}
