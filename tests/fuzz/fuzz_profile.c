/* Fuzz target: the calibration-profile loader, and a model planned with it. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "memledger/memledger.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ml_profile *p = NULL;
    ml_error e;
    if (ml_profile_load_string((const char *)data, size, "fuzz.yaml", &p, &e) != ML_OK)
        return 0;
    FILE *f = fopen("/dev/null", "w");
    if (f) {
        ml_profile_write(f, p);
        fclose(f);
    }
    static const char model[] = "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n"
                                "  vocab: 100\n  max_positions: 32\n";
    ml_model *m = NULL;
    if (ml_model_load_string(model, sizeof model - 1, "m.yaml", &m, &e) == ML_OK) {
        ml_config c = ml_model_config(m);
        c.calib = p;
        ml_ledger *l = NULL;
        if (ml_ledger_evaluate(m, &c, false, &l, &e) == ML_OK)
            ml_ledger_destroy(l);
        ml_model_destroy(m);
    }
    ml_profile_destroy(p);
    return 0;
}
