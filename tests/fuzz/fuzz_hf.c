/* Fuzz target: the Hugging Face config.json import. */
#include <stdint.h>

#include "memledger/memledger.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ml_model *m = NULL;
    ml_error e;
    if (ml_model_load_hf_string((const char *)data, size, "config.json", &m, &e) != ML_OK)
        return 0;
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 1;
    if (c.training.seq_len > 32)
        c.training.seq_len = 32;
    ml_ledger *l = NULL;
    if (ml_ledger_evaluate(m, &c, false, &l, &e) == ML_OK)
        ml_ledger_destroy(l);
    ml_model_destroy(m);
    return 0;
}
