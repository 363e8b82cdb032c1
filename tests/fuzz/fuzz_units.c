/* Fuzz target: the size and checkpoint-policy parsers. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "memledger/memledger.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    uint64_t v;
    ml_error e;
    if (ml_parse_size(s, &v, &e) == ML_OK && v == 0)
        abort(); /* sizes are at least one byte */
    ml_checkpoint c;
    if (ml_parse_checkpoint(s, &c, &e) == ML_OK) {
        char buf[4096], again[4096];
        ml_checkpoint_format(&c, buf, sizeof buf);
        ml_checkpoint c2;
        /* what we print, we parse back to the same text */
        if (ml_parse_checkpoint(buf, &c2, &e) != ML_OK)
            abort();
        ml_checkpoint_format(&c2, again, sizeof again);
        if (strcmp(buf, again))
            abort();
    }
    free(s);
    return 0;
}
