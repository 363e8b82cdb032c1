/* Stand-in for a backend that is not built. */
#include <stddef.h>

#include "backend.h"

#ifndef ML_HAVE_CUDA
ml_backend *ml_backend_cuda(const char **why)
{
    *why = "not built: the CUDA toolkit and cuBLAS were not found at build time (-Dcuda)";
    return NULL;
}
#endif
