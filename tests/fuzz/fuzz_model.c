/* Fuzz target: the model YAML loader, then (when it loads) an evaluation and
 * both reports, on capped sizes so each input runs in microseconds. */
#include <stdint.h>
#include <stdio.h>

#include "memledger/memledger.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ml_model *m = NULL;
    ml_error e;
    if (ml_model_load_string((const char *)data, size, "fuzz.yaml", &m, &e) != ML_OK)
        return 0;
    ml_config c = ml_model_config(m);
    if (c.training.micro_batch > 4)
        c.training.micro_batch = 4;
    if (c.training.seq_len > 64)
        c.training.seq_len = 64;
    /* the event list and the caching allocator's simulation only for chains
     * of at most 2,048 blocks: a node-level replay of 100,000 layers has
     * millions of events and allocations, seconds of work under the
     * sanitizers that find nothing the short chains do not; the long ones
     * are planned in the allocated view */
    ml_ledger *l = NULL;
    const ml_allocator sim = c.device.allocator;
    c.device.allocator = ML_ALLOCATOR_NONE;
    if (ml_ledger_evaluate(m, &c, false, &l, &e) == ML_OK && ml_ledger_block_count(l) <= 2048) {
        ml_ledger_destroy(l);
        l = NULL;
        c.device.allocator = sim;
        if (ml_ledger_evaluate(m, &c, true, &l, &e) != ML_OK)
            l = NULL;
    }
    if (l) {
        FILE *f = fopen("/dev/null", "w");
        if (f) {
            ml_report_text(f, m, &c, l);
            ml_report_json(f, m, &c, l);
            ml_report_timeline_csv(f, l);
            fclose(f);
        }
        ml_ledger_destroy(l);
    }
    ml_model_destroy(m);
    return 0;
}
