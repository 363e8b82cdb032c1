/* Using libmemledger from a program (a scheduler, a launcher): load a model,
 * evaluate a plan, read the peak. Build with
 *   cc example.c $(pkg-config --cflags --libs memledger)
 * Run: ./example models/gpt2-small.yaml */
#include <stdio.h>

#include <memledger/memledger.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.yaml\n", argv[0]);
        return 2;
    }
    ml_model *model = NULL;
    ml_error err;
    if (ml_model_load_file(argv[1], &model, &err) != ML_OK) {
        fprintf(stderr, "%s:%u:%u: %s\n", err.path, err.line, err.col, err.msg);
        return 2;
    }
    /* the file's settings, changed as a scheduler would: 16 GiB, micro-batch 4 */
    ml_config cfg = ml_model_config(model);
    cfg.training.micro_batch = 4;
    cfg.device.present = true;
    cfg.device.memory = 16ull << 30;
    cfg.device.budget = 0; /* default: memory - runtime reserve */
    ml_ledger *ledger = NULL;
    if (ml_ledger_evaluate(model, &cfg, false, &ledger, &err) != ML_OK) {
        fprintf(stderr, "%s\n", err.msg);
        ml_model_destroy(model);
        return 2;
    }
    const ml_summary *s = ml_ledger_summary(ledger);
    char peak[32];
    ml_format_bytes(s->peak_total, peak, sizeof peak);
    printf("%s: %llu parameters, peak %s (%llu bytes) during %s at %s: %s\n",
           ml_model_name(model), (unsigned long long)s->params, peak,
           (unsigned long long)s->peak_total, ml_phase_name(s->peak_phase), s->peak_step,
           s->fits ? "fits" : "does not fit");
    int rc = s->params == 124439808ull && s->peak_total > s->peak ? 0 : 1;
    ml_ledger_destroy(ledger);
    ml_model_destroy(model);
    return rc;
}
