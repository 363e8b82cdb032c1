/* ml_backend_cuda() when the CUDA toolkit and cuBLAS were not found at build
 * time (calib/meson.build compiles this file instead of backend_cuda.c). */
#include <stddef.h>

#include "backend.h"

ml_backend *ml_backend_cuda(const char **why)
{
    *why = "not built: the CUDA toolkit and cuBLAS were not found at build time (-Dcuda)";
    return NULL;
}
