/* Host allocation failures for the tests linked with
 * --wrap=malloc,calloc,realloc (test_nomem.c, test_alloc.c): set countdown
 * to n and the nth allocation from then on fails (persistent: that one and
 * every later one); failures counts those failed. Include it in one file
 * of the test executable only: it defines the wrappers. */
#ifndef ML_TEST_FAULT_INJECT_H
#define ML_TEST_FAULT_INJECT_H

#include <stdbool.h>
#include <stdlib.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);

static long countdown = -1; /* < 0: disarmed */
static bool persistent;     /* once failed, fail every later call */
static unsigned failures;

static bool fail_now(void)
{
    if (countdown < 0)
        return false;
    if (countdown == 0 || --countdown == 0) {
        failures++;
        if (!persistent)
            countdown = -1;
        return true;
    }
    return false;
}

void *__wrap_malloc(size_t n)
{
    return fail_now() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t m)
{
    return fail_now() ? NULL : __real_calloc(n, m);
}

void *__wrap_realloc(void *p, size_t n)
{
    return fail_now() ? NULL : __real_realloc(p, n);
}

#endif
