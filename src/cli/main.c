/* memledger: verbs dispatched from a table (git's style). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} verbs[] = {
    {"plan", ml_cmd_plan, "the memory ledger and FLOPs of one training iteration"},
    {"fit", ml_cmd_fit, "the largest micro-batch that fits, and the accumulation steps"},
    {"compare", ml_cmd_compare, "checkpoint policies side by side"},
    {"timeline", ml_cmd_timeline, "every event of the iteration as CSV, JSON or an SVG chart"},
    {"report", ml_cmd_report, "a self-contained HTML report"},
    {"calibrate", ml_cmd_calibrate, "fit measured peaks, or measure on this machine's GPU/CPU"},
    {"allocator", ml_cmd_allocator, "an allocation trace through PyTorch's caching allocator"},
    {"triage", ml_cmd_triage, "what an out-of-memory peak is made of, and each remedy"},
    {"colocate", ml_cmd_colocate, "training jobs sharing one device: the sum, in time"},
    {"devices", ml_cmd_devices, "the device presets --device NAME takes"},
};

static void help(FILE *f)
{
    fprintf(f, "usage: memledger VERB MODEL.yaml [options]\n\n"
               "Plans GPU training memory and FLOPs before a job is launched.\n\nVerbs:\n");
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
        fprintf(f, "  %-10s %s\n", verbs[i].name, verbs[i].summary);
    fprintf(f, "\n'memledger VERB --help' lists a verb's options.\n"
               "Exit status: 0 ran (and fits), 1 does not fit, 2 bad input or usage,\n"
               "3 output could not be written, 4 (--emit) settings written but part of\n"
               "the plan must be applied in code.\n");
}

/* The verb named name, or NULL (the message and the help printed). */
typedef int (*verb_fn)(int argc, char **argv);

static verb_fn verb_named(const char *name)
{
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
        if (!strcmp(name, verbs[i].name))
            return verbs[i].run;
    ml_cli_errorf("unknown verb '%s'", name);
    help(stderr);
    return NULL;
}

static int run(int argc, char **argv)
{
    if (argc < 2) {
        help(stderr);
        return ML_EXIT_BAD_INPUT;
    }
    /* "help VERB" is "VERB --help" */
    if (!strcmp(argv[1], "help") && argc > 2 && strcmp(argv[2], "help")) {
        char *args[] = {"--help", NULL};
        verb_fn verb = verb_named(argv[2]);
        return verb ? verb(1, args) : ML_EXIT_BAD_INPUT;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        help(stdout);
        return ML_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("memledger %s\n", ML_VERSION);
        return ML_EXIT_OK;
    }
    verb_fn verb = verb_named(argv[1]);
    return verb ? verb(argc - 2, argv + 2) : ML_EXIT_BAD_INPUT;
}

int main(int argc, char **argv)
{
    int rc = run(argc, argv);
    /* help and version go straight to stdout: a write that failed there
     * (a full disk, a closed pipe) is an output failure, as for reports */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        if (rc == ML_EXIT_OK) {
            ml_cli_errorf("could not write to standard output");
            rc = ML_EXIT_FAILURE;
        }
    }
    return rc;
}
