/* ml_backend_cpu() when OpenBLAS was not found at build time
 * (calib/meson.build compiles this file instead of backend_cpu.c). */
#include <stddef.h>

#include "backend.h"

ml_backend *ml_backend_cpu(const char **why)
{
    *why = "not built: OpenBLAS was not found at build time (apt-get install libopenblas-dev)";
    return NULL;
}
