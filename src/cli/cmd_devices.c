/* memledger devices: the device presets --device NAME takes (docs/devices.md). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "report/report_internal.h"

static const char usage[] =
    "usage: memledger devices [--format text|json] [-o FILE]\n"
    "\n"
    "The devices --device NAME and a model file's device.name take: the name and\n"
    "its aliases, the memory (the driver's total, or nominal where unpublished), and\n"
    "the dense peak per compute\n"
    "dtype in TFLOP/s (0: not supported or not published), and the memory bandwidth\n"
    "(GB/s) and SMs the per-op step time uses (docs/time.md). Sources: docs/devices.md.\n"
    "\n"
    "Exit status: 0 listed, 2 usage, 3 output could not be written.\n";

static void text(FILE *f, const ml_device_preset *p, size_t n)
{
    char mem[32];
    int w = 4; /* the widest name: the columns stay aligned */
    for (size_t i = 0; i < n; i++)
        if ((int)strlen(p[i].name) > w)
            w = (int)strlen(p[i].name);
    fprintf(f, "%-*s %12s", w, "name", "memory");
    for (int k = 0; k < ML_COMPUTE_COUNT; k++)
        fprintf(f, " %7s", ml_compute_dtype_name((ml_compute_dtype)k));
    fputs("    GB/s  SMs  product (aliases)\n", f);
    for (size_t i = 0; i < n; i++) {
        ml_format_bytes(p[i].memory, mem, sizeof mem);
        fprintf(f, "%-*s %12s", w, p[i].name, mem);
        for (int k = 0; k < ML_COMPUTE_COUNT; k++)
            fprintf(f, " %7.5g", p[i].peak_tflops[k]);
        fprintf(f, " %7.5g %4u  %s", p[i].memory_gbps, p[i].sms, p[i].product);
        if (p[i].aliases && p[i].aliases[0])
            fprintf(f, " (%s)", p[i].aliases);
        fputc('\n', f);
    }
    fputs("\nTFLOP/s dense, per compute dtype; memory: the driver's total where a reading "
          "is published, else the nominal size; GB/s: the memory bandwidth (docs/devices.md).\n",
          f);
}

static void json(FILE *f, const ml_device_preset *p, size_t n)
{
    fputc('[', f);
    for (size_t i = 0; i < n; i++) {
        fputs(i ? ",\n {\"name\": " : "\n {\"name\": ", f);
        ml_json_put_string(f, p[i].name);
        fputs(", \"product\": ", f);
        ml_json_put_string(f, p[i].product);
        fputs(", \"aliases\": ", f);
        ml_json_put_string(f, p[i].aliases ? p[i].aliases : "");
        fprintf(f, ", \"memory\": %llu, \"peak_tflops\": {", (unsigned long long)p[i].memory);
        for (int k = 0; k < ML_COMPUTE_COUNT; k++)
            fprintf(f, "%s\"%s\": %.17g", k ? ", " : "", ml_compute_dtype_name((ml_compute_dtype)k),
                    p[i].peak_tflops[k]);
        fprintf(f, "}, \"memory_gbps\": %.17g, \"sms\": %u}", p[i].memory_gbps, p[i].sms);
    }
    fputs("\n]\n", f);
}

int ml_cmd_devices(int argc, char **argv)
{
    const char *output = NULL, *format = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage, stdout);
            return ML_EXIT_OK;
        }
        const char *arg = argv[i], *v = NULL;
        const char **slot = ml_cli_flag_is(arg, "--format", argc, argv, &i, &v)   ? &format
                            : ml_cli_flag_is(arg, "-o", argc, argv, &i, &v)       ? &output
                            : ml_cli_flag_is(arg, "--output", argc, argv, &i, &v) ? &output
                                                                                   : NULL;
        if (slot && v && *v && !*slot) {
            *slot = v;
            continue;
        }
        if (slot && v && *v) /* never the last one winning (docs/cli.md) */
            ml_cli_errorf("devices: %.*s: given twice (or with another name for it): give it "
                          "once",
                          (int)strcspn(arg, "="), arg);
        else if (slot)
            ml_cli_errorf("devices: %.*s needs a value", (int)strcspn(arg, "="), arg);
        else
            ml_cli_errorf("devices: '%s' is not an option here (--format text|json, -o FILE)",
                          arg);
        fputs("Try 'memledger devices --help'.\n", stderr);
        return ML_EXIT_BAD_INPUT;
    }
    if (!format)
        format = "text";
    const bool as_json = !strcmp(format, "json");
    if (!as_json && strcmp(format, "text")) {
        ml_cli_errorf("--format: '%s' is not one of text, json", format);
        return ML_EXIT_BAD_INPUT;
    }
    size_t n = 0;
    const ml_device_preset *p = ml_device_presets(&n);
    ml_out out;
    int rc = ml_out_open(&out, output);
    if (rc)
        return rc;
    if (as_json)
        json(out.f, p, n);
    else
        text(out.f, p, n);
    return ml_out_close(&out, !ferror(out.f));
}
