/* An allocation trace read for a plan's starting state (model.h,
 * ml_device.start, which the simulation replays first: reserved.c): the
 * trace format and its parser are the allocator's (src/alloc/trace.c,
 * docs/allocator.md). */
#include <stdlib.h>

#include "alloc/alloc.h"
#include "memledger/model.h"
#include "util/error.h"

ml_status ml_alloc_trace_load_file(const char *path, ml_alloc_trace **out, ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    size_t len = 0;
    char *text = ml__read_file(path, &len, err);
    if (!text)
        return err->code;
    ml_status st = ml__alloc_trace_parse(text, len, path, out, err);
    free(text);
    return st;
}

void ml_alloc_trace_destroy(ml_alloc_trace *t)
{
    ml__alloc_trace_free(t);
}
