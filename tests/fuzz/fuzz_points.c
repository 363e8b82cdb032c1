/* Fuzz target: the --points CSV reader and the analysis of its points. */
#include <stdint.h>
#include <stdlib.h>

#include "memledger/memledger.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ml_point *p = NULL;
    size_t n = 0;
    ml_error e;
    if (ml_points_parse_csv((const char *)data, size, "fuzz.csv", &p, &n, &e) != ML_OK)
        return 0;
    ml_points_fit r;
    ml_points_analyse(p, n, 6979321856ull, 80, &r, &e);
    free(p);
    return 0;
}
