/* Stand-in when OpenBLAS was not found at build time. */
#include <stddef.h>

#include "backend.h"

ml_backend *ml_backend_cpu(const char **why)
{
    *why = "not built: OpenBLAS was not found at build time (apt-get install libopenblas-dev)";
    return NULL;
}
