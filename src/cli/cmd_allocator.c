/* memledger allocator TRACE.csv: a trace of allocations and frees replayed
 * through the model of PyTorch's CUDA caching allocator (docs/allocator.md). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/decimal.h"
#include "alloc/alloc.h"
#include "cli/cli.h"
#include "util/error.h"
#include "util/utf8.h"

static const char usage[] =
    "usage: memledger allocator TRACE.csv [--device SIZE] [--allocator caching|expandable|none]\n"
    "                           [--max-split-size MB] [--allocator-start STATE.csv]\n"
    "                           [--format text|json] [-o FILE]\n"
    "\n"
    "Replays a trace of allocations and frees through a model of PyTorch's CUDA\n"
    "caching allocator and prints what torch.cuda.max_memory_allocated() and\n"
    "max_memory_reserved() would report: the allocated peak (in the allocator's\n"
    "rounded block sizes), the reserved peak, the most segments at once, and with\n"
    "--device whether, and at which event, the run would run out of memory.\n"
    "\n"
    "TRACE.csv: the header action,id,bytes, then one event per line: alloc,ID,BYTES,\n"
    "free,ID[,BYTES] or empty_cache. calib/snapshot_to_trace.py writes one from a\n"
    "PyTorch memory snapshot (torch.cuda.memory._snapshot()).\n"
    "\n"
    "  --device SIZE            what the allocator may reserve, e.g. 80GiB (default: no limit)\n"
    "  --allocator A            caching (default), expandable (expandable_segments:True),\n"
    "                           none (no cache: reserved = allocated)\n"
    "  --max-split-size MB      max_split_size_mb: a whole number of MiB, at least 20\n"
    "  --gc-threshold X         garbage_collection_threshold, 0 < X < 1 (needs --device)\n"
    "  --roundup-power2-divisions N   roundup_power2_divisions, a power of two up to 64\n"
    "  --allocator-start STATE  a trace replayed first: TRACE starts from the cache it\n"
    "                           leaves, with the peaks reset there (the counts are TRACE's)\n"
    "  --format text|json       (default text)\n"
    "  -o FILE                  write to FILE (atomically) instead of stdout\n"
    "\n"
    "Events are numbered from 1 in file order (the header, blank and '#' lines are\n"
    "not events). The replay stops at the first out-of-memory; the peaks are those\n"
    "up to it.\n"
    "\n"
    "Exit status: 0 ran (and fits the device), 1 out of memory on the device,\n"
    "2 bad input or usage, 3 output could not be written.\n";

static int usage_error(const char *fmt, const char *arg)
{
    char msg[4200];
    snprintf(msg, sizeof msg, fmt, arg);
    ml_cli_errorf("%s", msg);
    fprintf(stderr, "Try 'memledger allocator --help'.\n");
    return ML_EXIT_BAD_INPUT;
}

typedef struct {
    const char *trace, *output, *device, *allocator, *max_split, *gc, *divisions, *start;
    bool json;
} opts;

static int parse(int argc, char **argv, opts *o)
{
    static const struct {
        const char *flag;
        size_t off;
    } flags[] = {
        {"--device", offsetof(opts, device)},
        {"--allocator", offsetof(opts, allocator)},
        {"--max-split-size", offsetof(opts, max_split)},
        {"--gc-threshold", offsetof(opts, gc)},
        {"--roundup-power2-divisions", offsetof(opts, divisions)},
        {"--allocator-start", offsetof(opts, start)},
        {"--format", 0},
        {"-o", offsetof(opts, output)},
        {"--output", offsetof(opts, output)},
    };
    memset(o, 0, sizeof *o);
    bool format_given = false;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            fputs(usage, stdout);
            return -1;
        }
        if (arg[0] != '-' || !arg[1]) {
            if (o->trace)
                return usage_error("one trace only; '%s' is a second one", arg);
            o->trace = arg;
            continue;
        }
        const char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        size_t k;
        for (k = 0; k < sizeof flags / sizeof flags[0]; k++)
            if (strlen(flags[k].flag) == len && !strncmp(arg, flags[k].flag, len))
                break;
        if (k == sizeof flags / sizeof flags[0])
            return usage_error("unknown option '%s'", arg);
        /* the next argument is the value unless it is itself a flag ("-o
         * --device": -o was given no file name); "-" is standard output */
        const char *val = eq ? eq + 1 : i + 1 < argc ? argv[i + 1] : NULL;
        if (!eq && val && val[0] == '-' && val[1] && !isdigit((unsigned char)val[1]))
            val = NULL;
        if (!val || !*val)
            return usage_error(flags[k].off == offsetof(opts, output) ? "%s needs a file name"
                                                                      : "%s needs a value",
                               flags[k].flag);
        if (!eq)
            i++;
        /* a flag given twice (or -o and --output) is refused, never the
         * last one winning (docs/cli.md) */
        const char **slot = flags[k].off ? (const char **)((char *)o + flags[k].off) : NULL;
        if (slot ? *slot != NULL : format_given)
            return usage_error("%s: given twice (or with another name for it): give it once",
                               flags[k].flag);
        if (!slot) { /* --format */
            if (strcmp(val, "text") && strcmp(val, "json"))
                return usage_error("--format: '%s' is not a format; use text or json", val);
            o->json = !strcmp(val, "json");
            format_given = true;
        } else {
            *slot = val;
        }
    }
    if (!o->trace)
        return usage_error("%s", "missing the trace (a CSV with the header action,id,bytes)");
    int rc = ml_out_refuse_input(o->output, o->trace);
    return rc || !o->start ? rc : ml_out_refuse_input(o->output, o->start);
}

static int bad_flag(const char *flag, const char *msg, const char *val)
{
    ml_cli_errorf("%s: '%s' %s", flag, val, msg);
    return ML_EXIT_BAD_INPUT;
}

/* The flags as a simulator configuration; prints and returns 2 on error. */
static int config(const opts *o, ml_alloc_config *c)
{
    *c = ml__alloc_config_defaults();
    ml_error e;
    memset(&e, 0, sizeof e);
    if (o->device && ml_parse_size(o->device, &c->device_bytes, &e) != ML_OK) {
        ml_cli_errorf("--device: %s", e.msg);
        return ML_EXIT_BAD_INPUT;
    }
    if (o->device && !c->device_bytes)
        return bad_flag("--device", "is no memory at all", o->device);
    if (o->allocator && !ml__alloc_mode_parse(o->allocator, &c->mode))
        return bad_flag("--allocator", "is not an allocator; use caching, expandable or none",
                        o->allocator);
    if (o->max_split) {
        uint64_t mb = 0;
        if (ml_cli_max_split(o->max_split, &mb))
            return ML_EXIT_BAD_INPUT;
        c->max_split_size = mb << 20;
    }
    if (o->gc) {
        double x = 0;
        if (!ml__decimal(o->gc, &x) || !(x > 0 && x < 1))
            return bad_flag("--gc-threshold", "is not a fraction between 0 and 1 (exclusive)",
                            o->gc);
        if (!c->device_bytes)
            return bad_flag("--gc-threshold", "needs --device: PyTorch collects only under a "
                                              "memory limit", o->gc);
        c->gc_threshold = x;
    }
    if (o->divisions) {
        uint64_t d = 0;
        if (ml_cli_whole("--roundup-power2-divisions", o->divisions, 1, 64, &d))
            return ML_EXIT_BAD_INPUT;
        if (d & (d - 1))
            return bad_flag("--roundup-power2-divisions", "is not a power of two",
                            o->divisions);
        c->roundup_power2_divisions = (unsigned)d;
    }
    /* with no caching there is nothing to split, collect or round */
    const char *cache_flag = o->max_split ? "--max-split-size"
                             : o->gc      ? "--gc-threshold"
                             : o->divisions ? "--roundup-power2-divisions"
                                            : NULL;
    if (o->max_split && c->mode == ML_ALLOC_EXPANDABLE) {
        ml_cli_errorf("--max-split-size is not simulated with expandable segments (docs/"
                      "allocator.md, \"What is simplified\"): drop it, or use --allocator "
                      "caching");
        return ML_EXIT_BAD_INPUT;
    }
    if (cache_flag && c->mode == ML_ALLOC_NONE) {
        ml_cli_errorf("%s applies to a caching allocator, and --allocator none caches nothing: "
                      "drop it, or use --allocator caching or expandable",
                      cache_flag);
        return ML_EXIT_BAD_INPUT;
    }
    return 0;
}

static void write_text(FILE *f, const opts *o, const ml_alloc_config *c, const ml_alloc_trace *t,
                       const ml_alloc_replay_result *r)
{
    char a[32], b[32];
    const ml_alloc_stats *s = &r->stats;
    fprintf(f, "memledger allocator %s: %zu events (%zu allocs, %zu frees", o->trace, t->n,
            t->allocs, t->frees);
    if (t->empties)
        fprintf(f, ", %zu empty_cache", t->empties);
    fprintf(f, "), %s allocator", ml__alloc_mode_name(c->mode));
    if (c->max_split_size)
        fprintf(f, ", max_split_size %llu MiB", (unsigned long long)(c->max_split_size >> 20));
    fputc('\n', f);
    if (o->start) {
        ml_format_bytes(r->start.reserved.current, a, sizeof a);
        ml_format_bytes(r->start.allocated.current, b, sizeof b);
        fprintf(f, "  started from %s: %s reserved in %llu segments, %s allocated\n", o->start,
                a, (unsigned long long)r->start.segments.current, b);
    }
    ml_format_bytes(s->allocated.peak, a, sizeof a);
    fprintf(f, "  allocated peak  %12s  (%llu B, max_memory_allocated)\n", a,
            (unsigned long long)s->allocated.peak);
    ml_format_bytes(s->reserved.peak, a, sizeof a);
    fprintf(f, "  reserved peak   %12s  (%llu B, max_memory_reserved)\n", a,
            (unsigned long long)s->reserved.peak);
    fprintf(f, "  segments peak   %12llu  (%llu %s, %llu alloc retries)\n",
            (unsigned long long)s->segments.peak, (unsigned long long)s->device_allocs,
            c->mode == ML_ALLOC_EXPANDABLE ? "page mappings" : "cudaMalloc calls",
            (unsigned long long)s->num_alloc_retries);
    if (!c->device_bytes && r->oom_index == SIZE_MAX)
        return;
    if (r->oom_index == SIZE_MAX) {
        ml_format_bytes(c->device_bytes, a, sizeof a);
        fprintf(f, "  device %s: fits\n", a);
        return;
    }
    const ml_alloc_event *e = &t->ev[r->oom_index];
    ml_format_bytes(e->bytes, b, sizeof b);
    if (c->device_bytes) {
        ml_format_bytes(c->device_bytes, a, sizeof a);
        fprintf(f, "  device %s: OUT OF MEMORY", a);
    } else {
        /* without a device only a request past the simulator's address
         * space fails (docs/allocator.md) */
        fputs("  no --device, yet OUT OF MEMORY", f);
    }
    fprintf(f, " at event %zu (line %u: alloc of '%s', %s); the peaks above are up to it\n",
            r->oom_index + 1, e->line, t->ids[r->oom_index], b);
    if (c->device_bytes)
        return;
    /* alloc.h: PyTorch refuses ML_ALLOC_MAX_REQUEST and more; expandable
     * segments map at most 1 1/8 of the device taken without one */
    ml_format_bytes(c->mode == ML_ALLOC_EXPANDABLE
                        ? ML_ALLOC_NO_DEVICE_BYTES + ML_ALLOC_NO_DEVICE_BYTES / 8
                        : ML_ALLOC_MAX_REQUEST,
                    a, sizeof a);
    if (c->mode == ML_ALLOC_EXPANDABLE)
        fprintf(f, "  (without --device only a request of more than %s fails: the expandable "
                   "segments' address space)\n",
                a);
    else
        fprintf(f, "  (without --device only a request of %s or more fails: PyTorch refuses "
                   "it)\n",
                a);
}

static void write_json(FILE *f, const opts *o, const ml_alloc_config *c, const ml_alloc_trace *t,
                       const ml_alloc_replay_result *r)
{
    const ml_alloc_stats *s = &r->stats;
    fputs("{\"trace\": ", f);
    ml_json_put_string(f, o->trace);
    fprintf(f, ", \"allocator\": \"%s\", \"events\": %zu, \"allocs\": %zu, \"frees\": %zu, "
               "\"allocated_peak\": %llu, \"reserved_peak\": %llu, \"segments_peak\": %llu, "
               "\"requested_peak\": %llu, \"device_allocs\": %llu, \"num_alloc_retries\": %llu",
            ml__alloc_mode_name(c->mode), t->n, t->allocs, t->frees,
            (unsigned long long)s->allocated.peak, (unsigned long long)s->reserved.peak,
            (unsigned long long)s->segments.peak, (unsigned long long)s->requested.peak,
            (unsigned long long)s->device_allocs, (unsigned long long)s->num_alloc_retries);
    if (c->max_split_size)
        fprintf(f, ", \"max_split_size\": %llu", (unsigned long long)c->max_split_size);
    else
        fputs(", \"max_split_size\": null", f);
    if (c->device_bytes)
        fprintf(f, ", \"device\": %llu", (unsigned long long)c->device_bytes);
    else
        fputs(", \"device\": null", f);
    if (r->oom_index != SIZE_MAX)
        fprintf(f, ", \"oom_at\": %zu, \"oom_line\": %u, \"oom_bytes\": %llu",
                r->oom_index + 1, t->ev[r->oom_index].line,
                (unsigned long long)t->ev[r->oom_index].bytes);
    else
        fputs(", \"oom_at\": null, \"oom_line\": null, \"oom_bytes\": null", f);
    fprintf(f, ", \"empty_caches\": %zu", t->empties);
    if (o->start) {
        fputs(", \"start\": {\"trace\": ", f);
        ml_json_put_string(f, o->start);
        fprintf(f, ", \"reserved\": %llu, \"allocated\": %llu, \"segments\": %llu}",
                (unsigned long long)r->start.reserved.current,
                (unsigned long long)r->start.allocated.current,
                (unsigned long long)r->start.segments.current);
    } else {
        fputs(", \"start\": null", f);
    }
    fputs("}\n", f);
}

int ml_cmd_allocator(int argc, char **argv)
{
    opts o;
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc < 0 ? ML_EXIT_OK : rc;
    ml_alloc_config c;
    if ((rc = config(&o, &c)) != 0)
        return rc;
    ml_error e;
    ml_alloc_trace *t = NULL;
    ml_status st = ml_alloc_trace_load_file(o.trace, &t, &e);
    if (st) {
        ml_cli_print_error(&e);
        return st == ML_NOMEM ? ML_EXIT_FAILURE : ML_EXIT_BAD_INPUT;
    }
    ml_alloc_trace *start = NULL;
    if (o.start && (st = ml_alloc_trace_load_file(o.start, &start, &e)) != ML_OK) {
        ml_cli_print_error(&e);
        ml__alloc_trace_free(t);
        return st == ML_NOMEM ? ML_EXIT_FAILURE : ML_EXIT_BAD_INPUT;
    }
    ml_alloc_replay_result r;
    ml_alloc_result ar = ml__alloc_replay_from(&c, start, t, &r);
    ml__alloc_trace_free(start);
    if (ar) {
        if (ar == ML_ALLOC_OOM && c.device_bytes)
            ml_cli_errorf("--allocator-start: %s runs out of the device itself, before %s "
                          "starts: give a larger --device, or a smaller start", o.start, o.trace);
        else if (ar == ML_ALLOC_OOM)
            ml_cli_errorf("--allocator-start: %s asks for more than the allocator gives "
                          "without a device (docs/allocator.md), before %s starts", o.start,
                          o.trace);
        else
            ml_cli_errorf("%s", ar == ML_ALLOC_NOMEM ? "out of memory" : "invalid allocator settings");
        ml__alloc_trace_free(t);
        return ar == ML_ALLOC_NOMEM ? ML_EXIT_FAILURE : ar == ML_ALLOC_OOM ? ML_EXIT_NO_FIT
                                                                          : ML_EXIT_BAD_INPUT;
    }
    ml_out out;
    rc = ml_out_open(&out, o.output);
    if (!rc && !o.json)
        rc = ml_out_text(&out, o.trace);
    if (rc == 0) {
        if (o.json)
            write_json(out.f, &o, &c, t, &r);
        else
            write_text(out.f, &o, &c, t, &r);
        rc = ml_out_close(&out, !ferror(out.f));
    }
    if (!rc && r.oom_index != SIZE_MAX)
        rc = ML_EXIT_NO_FIT;
    ml__alloc_trace_free(t);
    return rc;
}
