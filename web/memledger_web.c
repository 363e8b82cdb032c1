/* The library's verbs for the web page (docs/web.md), compiled to
 * WebAssembly with the library by scripts/web.sh. One call plans one model
 * text with one set of settings and returns a string the caller frees with
 * mlw_free: '0' then the verb's output (the JSON the command line's
 * --format json prints, or the timeline's SVG), or '1' then the error as
 * JSON ({"status", "path", "line", "col", "message"}). Nothing is kept
 * between calls: a plan takes milliseconds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memledger/memledger.h"
#include "util/utf8.h" /* ml_json_put_string */

#ifdef __EMSCRIPTEN__
#include <emscripten/emscripten.h>
#define MLW_EXPORT EMSCRIPTEN_KEEPALIVE
#else
#define MLW_EXPORT
#endif

/* '1' and the error as JSON. */
static char *failure(const ml_error *e)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return NULL;
    fputs("1{\"status\": ", f);
    ml_json_put_string(f, ml_status_name(e->code));
    fputs(", \"path\": ", f);
    ml_json_put_string(f, e->path);
    fprintf(f, ", \"line\": %u, \"col\": %u, \"message\": ", e->line, e->col);
    ml_json_put_string(f, e->msg);
    fputc('}', f);
    fclose(f);
    return buf;
}

/* A setting refused once the model loaded: in the model text's name, at
 * the line and column where the text set it (as the command line says it,
 * ml_model_key_position). */
static void locate(const ml_model *m, const char *name, const char *settings, ml_error *e)
{
    /* a key the page's inputs set is theirs, not the text's (as a flag is
     * the command line's) */
    for (const char *p = settings ? settings : ""; *p;) {
        const char *eq = strchr(p, '='), *nl = strchr(p, '\n');
        const size_t kl = eq && (!nl || eq < nl) ? (size_t)(eq - p) : 0;
        if (kl && !strncmp(e->msg, p, kl) && e->msg[kl] == ':')
            return;
        p = nl ? nl + 1 : p + strlen(p);
    }
    if (!e->path[0])
        snprintf(e->path, sizeof e->path, "%s", name ? name : "");
    if (!e->line)
        ml_model_locate_error(m, e);
}

static char *success(const char *text, size_t len)
{
    char *out = malloc(len + 2);
    if (!out)
        return NULL;
    out[0] = '0';
    memcpy(out + 1, text, len);
    out[len + 1] = '\0';
    return out;
}

/* A whole number in [lo, hi] with nothing after it; false: not one. */
static bool whole(const char *v, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end = NULL;
    if (!*v || *v == '-' || *v == '+')
        return false;
    const unsigned long long n = strtoull(v, &end, 10);
    if (*end || n < lo || n > hi)
        return false;
    *out = n;
    return true;
}

/* The layout search's own keys (fit --gpus's flags, their ranges), into
 * req: ML_OK, ML_RANGE with the reason, or ML_USAGE when key is not one of
 * them (then *mine is false). */
static ml_status request_key(const char *key, const char *value, ml_layout_request *req,
                             bool *mine, ml_error *err)
{
    *mine = req != NULL;
    bool ok = true;
    if (!req)
        return ML_OK;
    if (!strcmp(key, "gpus")) {
        ok = whole(value, 1, UINT64_C(1) << 20, &req->gpus);
    } else if (!strcmp(key, "global_batch")) {
        ok = whole(value, 1, UINT64_C(1) << 40, &req->global_batch);
    } else if (!strcmp(key, "gpus_per_node")) {
        ok = whole(value, 1, 1024, &req->gpus_per_node);
    } else if (!strcmp(key, "network")) {
        char *end = NULL;
        req->network_gbps = strtod(value, &end);
        ok = end != value && !*end && req->network_gbps >= 1e-6 && req->network_gbps <= 1e6;
    } else {
        *mine = false;
        return ML_OK;
    }
    if (ok)
        return ML_OK;
    memset(err, 0, sizeof *err);
    err->code = ML_RANGE;
    snprintf(err->msg, sizeof err->msg, "%s: '%s' is not %s", key, value,
             !strcmp(key, "network")        ? "a number between 1e-06 and 1e+06 (GB/s)"
             : !strcmp(key, "gpus")         ? "a whole number from 1 to 1048576"
             : !strcmp(key, "global_batch") ? "a whole number from 1 to 1099511627776"
                                            : "a whole number from 1 to 1024");
    return ML_RANGE;
}

/* The settings, one "key=value" a line, onto the job or the config (and a
 * layout search's request); "attention" is the model's (set before
 * either). */
static ml_status apply(ml_model *m, ml_job *job, ml_config *cfg, ml_layout_request *req,
                       const char *settings, ml_error *err)
{
    const char *p = settings ? settings : "";
    ml_status st = ML_OK;
    while (*p && !st) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char line[1024];
        if (len >= sizeof line) {
            memset(err, 0, sizeof *err);
            err->code = ML_USAGE;
            snprintf(err->msg, sizeof err->msg, "a setting longer than %zu characters",
                     sizeof line - 1);
            return ML_USAGE;
        }
        memcpy(line, p, len);
        line[len] = '\0';
        p += len + (nl ? 1 : 0);
        if (!line[0])
            continue; /* an empty line */
        char *eq = strchr(line, '=');
        if (!eq || eq == line) {
            memset(err, 0, sizeof *err);
            err->code = ML_USAGE;
            snprintf(err->msg, sizeof err->msg, "setting '%.200s': not key=value", line);
            return ML_USAGE;
        }
        *eq = '\0';
        const char *key = line, *value = eq + 1;
        bool mine = false;
        if ((st = request_key(key, value, req, &mine, err)) || mine)
            continue;
        if (!strcmp(key, "attention"))
            st = ml_model_set_attention(m, value, err);
        else if (job)
            st = ml_job_set(job, key, value, err);
        else
            st = ml_config_set(cfg, key, value, err);
        if (!st && !job) /* (a job checks it itself) */
            st = ml_model_check_seq(m, &cfg->training, err);
    }
    return st;
}

/* fit --gpus's layout search, as `memledger fit --gpus N --format json`
 * prints it. */
static char *layouts(ml_model *m, const char *settings, ml_error *err)
{
    ml_config cfg = ml_model_config(m);
    ml_layout_request req = ml_layout_request_defaults();
    if (apply(m, NULL, &cfg, &req, settings, err))
        return failure(err);
    if (req.network_gbps > 0 && cfg.device.interconnect_gbps <= 0) {
        memset(err, 0, sizeof *err);
        err->code = ML_USAGE;
        snprintf(err->msg, sizeof err->msg, "network: the transfers inside a node need a "
                                            "bandwidth too: give device.interconnect_gbps");
        return failure(err);
    }
    ml_layout_result r;
    if (ml_layout_search(m, &cfg, &req, &r, err))
        return failure(err);
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    int rc = f ? ml_report_layouts_json(f, m, &req, &r) : -1;
    if (f)
        fclose(f);
    char *out = rc == 0 && buf ? success(buf, n) : NULL;
    free(buf);
    return out;
}

static char *report(ml_model *m, const char *verb, const char *settings, ml_error *err)
{
    if (!strcmp(verb, "layouts"))
        return layouts(m, settings, err);
    ml_job *job = NULL;
    if (ml_job_create(m, &job, err))
        return failure(err);
    ml_status st = apply(m, job, NULL, NULL, settings, err);
    char *json = NULL;
    size_t len = 0;
    if (!st) {
        if (!strcmp(verb, "plan"))
            st = ml_job_plan_json(job, &json, &len, err);
        else if (!strcmp(verb, "fit"))
            st = ml_job_fit_json(job, &json, &len, err);
        else if (!strcmp(verb, "compare"))
            st = ml_job_compare_json(job, &json, &len, err);
        else if (!strcmp(verb, "timeline"))
            st = ml_job_timeline_json(job, &json, &len, err);
        else if (!strcmp(verb, "svg")) /* the timeline drawn */
            st = ml_job_timeline_svg(job, &json, &len, err);
        else {
            memset(err, 0, sizeof *err);
            err->code = st = ML_USAGE;
            snprintf(err->msg, sizeof err->msg,
                     "'%s' is not a verb: plan, fit, compare, timeline, svg or layouts",
                     verb);
        }
    }
    ml_job_destroy(job);
    char *out = st ? failure(err) : success(json, len);
    ml_json_free(json);
    return out;
}

/* verb: plan, fit, compare, timeline, layouts (JSON) or svg; text: a model YAML, or
 * a Hugging Face config.json when hf is not 0; name: the file name in
 * messages; settings: "key=value" lines (ml_config_set's keys, fit's
 * global_batch and max_micro_batch, attention). */
MLW_EXPORT char *mlw_run(const char *verb, const char *text, int hf, const char *name,
                         const char *settings)
{
    ml_error err;
    memset(&err, 0, sizeof err);
    ml_model *m = NULL;
    const size_t len = text ? strlen(text) : 0;
    ml_status st = hf ? ml_model_load_hf_string(text ? text : "", len, name, &m, &err)
                      : ml_model_load_string(text ? text : "", len, name, &m, &err);
    if (st)
        return failure(&err);
    char *out = report(m, verb ? verb : "", settings, &err);
    if (out && out[0] == '1' && err.code) { /* a refusal: where the text set the key */
        free(out);
        locate(m, name, settings, &err);
        out = failure(&err);
    }
    ml_model_destroy(m);
    return out;
}

/* The device presets as JSON: [{"name", "product", "memory"}, ...]. */
MLW_EXPORT char *mlw_devices(void)
{
    size_t n = 0;
    const ml_device_preset *p = ml_device_presets(&n);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    fputc('[', f);
    for (size_t i = 0; i < n; i++) {
        fputs(i ? ", {\"name\": " : "{\"name\": ", f);
        ml_json_put_string(f, p[i].name);
        fputs(", \"product\": ", f);
        ml_json_put_string(f, p[i].product ? p[i].product : "");
        fprintf(f, ", \"memory\": %llu}", (unsigned long long)p[i].memory);
    }
    fputc(']', f);
    fclose(f);
    return buf;
}

MLW_EXPORT const char *mlw_version(void)
{
    return ML_VERSION;
}

MLW_EXPORT void mlw_free(char *s)
{
    free(s);
}
