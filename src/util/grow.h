/* Growing an array by doubling: the one pattern every builder of a list in
 * memledger uses (blocks, saved tensors, events, points, YAML nodes). */
#ifndef ML_UTIL_GROW_H
#define ML_UTIL_GROW_H

#include <stdint.h>
#include <stdlib.h>

/* Room for element n of v (cap allocated, elem bytes each): v itself when
 * n < *cap, else v reallocated to twice the capacity (first when empty) with
 * *cap updated. NULL when out of memory; v is then unchanged and still the
 * caller's. */
static inline void *ml_grow(void *v, size_t n, size_t *cap, size_t elem, size_t first)
{
    if (n < *cap)
        return v;
    size_t c = *cap ? *cap * 2 : first;
    void *nv = realloc(v, c * elem);
    if (nv)
        *cap = c;
    return nv;
}

/* Room for n elements in v (cap allocated, elem bytes each): v itself when
 * n <= *cap, else v reallocated once to the capacity (first when empty)
 * doubled until n fits, with *cap updated. NULL when out of memory or
 * when that capacity would pass SIZE_MAX bytes; v is then unchanged and
 * still the caller's. */
static inline void *ml_grow_to(void *v, size_t n, size_t *cap, size_t elem, size_t first)
{
    if (n <= *cap)
        return v;
    size_t c = *cap ? *cap : first;
    while (c < n) {
        if (c > SIZE_MAX / 2 / elem)
            return NULL;
        c *= 2;
    }
    void *nv = realloc(v, c * elem);
    if (nv)
        *cap = c;
    return nv;
}

#endif
