#include "memledger/error.h"

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
