/* plan and fit under a length distribution: --lengths FILE|QUANTILES,
 * --batching padded|bucketed|packed, --max-tokens N|auto, --buckets K
 * (docs/lengths.md). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "report/report_internal.h"

/* The flags that need --lengths. */
static int needs_lengths(const ml_cli_opts *o)
{
    const char *flag = o->batching ? "--batching" : o->max_tokens ? "--max-tokens"
                                                  : o->buckets    ? "--buckets"
                                                                  : NULL;
    if (flag && !o->lengths) {
        ml_cli_errorf("%s needs --lengths FILE or --lengths p50=...,max=...", flag);
        return ML_EXIT_BAD_INPUT;
    }
    return 0;
}

/* The distribution and the request from the flags; 0 or an exit status
 * (message printed). *auto_tokens: --max-tokens auto. */
static int lengths_request(const ml_cli_opts *o, ml_lengths **d, ml_lengths_request *req,
                           bool *auto_tokens)
{
    *d = NULL;
    *req = ml_lengths_request_defaults();
    *auto_tokens = false;
    int rc0 = needs_lengths(o);
    if (rc0)
        return rc0;
    if (o->batching && !ml_batching_parse(o->batching, &req->batching)) {
        ml_cli_errorf("--batching: unknown '%s'; use padded, bucketed or packed", o->batching);
        return ML_EXIT_BAD_INPUT;
    }
    uint64_t v;
    if (o->buckets) {
        if (req->batching != ML_BATCHING_BUCKETED) {
            ml_cli_errorf("--buckets goes with --batching bucketed");
            return ML_EXIT_BAD_INPUT;
        }
        int rc = ml_cli_whole("--buckets", o->buckets, 1, ML_LENGTHS_MAX_BUCKETS, &v);
        if (rc)
            return rc;
        req->buckets = (unsigned)v;
    }
    if (o->max_tokens) {
        if (req->batching != ML_BATCHING_PADDED) {
            ml_cli_errorf("--max-tokens goes with --batching padded (the default)");
            return ML_EXIT_BAD_INPUT;
        }
        if (!strcmp(o->max_tokens, "auto"))
            *auto_tokens = true;
        else if (ml_cli_whole("--max-tokens", o->max_tokens, 1, 1ull << 34, &req->max_tokens))
            return ML_EXIT_BAD_INPUT;
    }
    ml_error e;
    memset(&e, 0, sizeof e);
    /* quantiles ("p50=120,max=512") unless a file has that name */
    const bool quantiles = strchr(o->lengths, '=') && access(o->lengths, F_OK) != 0;
    ml_status st = quantiles ? ml_lengths_parse_quantiles(o->lengths, d, &e)
                             : ml_lengths_load(o->lengths, d, &e);
    if (st) {
        if (quantiles)
            ml_cli_errorf("--lengths: %s",
                          strncmp(e.msg, "lengths: ", 9) ? e.msg : e.msg + 9);
        else
            ml_cli_print_error(&e);
        return st == ML_NOMEM ? ML_EXIT_FAILURE : ML_EXIT_BAD_INPUT;
    }
    return 0;
}

int ml_cli_lengths_failed(const ml_cli_opts *o, ml_error *e, ml_status st)
{
    if (st == ML_USAGE || (st == ML_RANGE && !strncmp(e->msg, "lengths:", 8))) {
        ml_cli_errorf("%s", e->msg);
        return ML_EXIT_BAD_INPUT;
    }
    return ml_cli_eval_failed(o, e, st);
}

/* Writes the report: plan's (l: the plan at the configured shape, then the
 * lengths section) or fit's (l NULL: the model, the answer, the lengths
 * section); found: fit --max-tokens auto's answer. 0 or an exit status. */
/* fit --lengths' JSON up to its lengths object: the model and the device */
static void fit_json_head(FILE *f, const ml_model *m, const ml_config *cfg)
{
    fputs("{\"model\": ", f);
    ml_json_put_string(f, ml_model_name(m));
    fprintf(f, ", \"device\": {\"memory\": %llu, \"budget\": %llu},\n \"lengths\": ",
            (unsigned long long)cfg->device.memory,
            (unsigned long long)ml_device_budget(&cfg->device));
}

/* fit --lengths' text heading: the model, the device and its budget */
static void fit_text_head(FILE *f, const ml_model *m, const ml_config *cfg)
{
    char mem[32], bud[32];
    ml_format_bytes(cfg->device.memory, mem, sizeof mem);
    ml_format_bytes(ml_device_budget(&cfg->device), bud, sizeof bud);
    fprintf(f, "memledger fit: %s on %s (budget %s for the %s)\n", ml_model_name(m), mem, bud,
            ml__report_budget_holds(&cfg->device));
}

/* fit --max-tokens auto's answer at the search's limit: said (a larger
 * budget would make batches past the micro-batch limit), in words or as
 * JSON's at_search_limit. */
static bool at_limit(const ml_lengths *d, const ml_lengths_request *req)
{
    return req->max_tokens && req->max_tokens == ml_lengths_budget_limit(d);
}

static int write_report(const ml_cli_opts *o, const ml_model *m, const ml_config *cfg,
                        const ml_ledger *l, const ml_lengths *d, const ml_lengths_request *req,
                        const ml_lengths_result *r, bool found)
{
    ml_out out;
    int rc = ml_out_open_report(&out, o->output, o->format == ML_FMT_TEXT, m, cfg);
    if (rc)
        return rc;
    FILE *f = out.f;
    int w;
    ml_report_verdict v; /* with a device the lengths decide (docs/lengths.md) */
    ml__report_lengths_verdict(r, &v);
    if (l)
        w = o->format == ML_FMT_JSON
                ? ml_report_json_lengths(f, m, cfg, l, d, req, r)
                : ml__report_text_verdict(f, m, cfg, l, cfg->device.present ? &v : NULL) ||
                      ml_report_lengths_text(f, cfg, d, o->lengths, req, r);
    else if (o->format == ML_FMT_JSON) {
        fit_json_head(f, m, cfg);
        w = ml_report_lengths_json_object(f, d, req, r);
        if (found)
            fprintf(f, ", \"at_search_limit\": %s", at_limit(d, req) ? "true" : "false");
        fputs("}\n", f);
    } else {
        fit_text_head(f, m, cfg);
        if (found)
            fprintf(f, "largest token budget whose worst batch fits: %llu tokens per batch "
                       "(--max-tokens %llu)\n",
                    (unsigned long long)req->max_tokens, (unsigned long long)req->max_tokens);
        if (found && at_limit(d, req))
            fprintf(f, "  the search's limit: a larger budget makes batches of more than "
                       "16777216 samples (the micro-batch limit) of the shortest length, %llu "
                       "token%s; larger budgets are not planned\n",
                    (unsigned long long)ml_lengths_min(d), ml_lengths_min(d) == 1 ? "" : "s");
        w = ml_report_lengths_text(f, cfg, d, o->lengths, req, r);
    }
    return ml_out_close(&out, w == 0 && !ferror(f));
}

int ml_cli_triage_lengths(const ml_cli_opts *o, ml_lengths **d, ml_lengths_request *req)
{
    bool auto_tokens;
    if (!o->lengths && !o->batching && !o->max_tokens && !o->buckets) {
        *d = NULL;
        *req = ml_lengths_request_defaults();
        return 0;
    }
    int rc = lengths_request(o, d, req, &auto_tokens);
    if (!rc && auto_tokens) {
        ml_cli_errorf("--max-tokens auto is for 'memledger fit'; triage takes a number (its "
                      "token-budget remedy is the largest budget that fits)");
        ml_lengths_destroy(*d);
        *d = NULL;
        rc = ML_EXIT_BAD_INPUT;
    }
    return rc;
}

int ml_cli_plan_lengths(const ml_cli_opts *o, const ml_model *m, const ml_config *cfg,
                        const ml_ledger *l)
{
    ml_lengths *d;
    ml_lengths_request req;
    bool auto_tokens;
    int rc = lengths_request(o, &d, &req, &auto_tokens);
    if (rc)
        return rc;
    if (auto_tokens) {
        ml_cli_errorf("--max-tokens auto is for 'memledger fit'; plan takes a number");
        ml_lengths_destroy(d);
        return ML_EXIT_BAD_INPUT;
    }
    if (o->emit) {
        ml_cli_errorf("--emit plans one batch shape; it does not go with --lengths");
        ml_lengths_destroy(d);
        return ML_EXIT_BAD_INPUT;
    }
    ml_lengths_result r;
    ml_error e;
    ml_status st = ml_lengths_plan(m, cfg, d, &req, &r, &e);
    if (st)
        rc = ml_cli_lengths_failed(o, &e, st);
    else if (!(rc = write_report(o, m, cfg, l, d, &req, &r, false)))
        rc = cfg->device.present && (r.p_over_budget > 0 || !r.max.fits) ? ML_EXIT_NO_FIT
                                                                            : ML_EXIT_OK;
    ml_lengths_destroy(d);
    return rc;
}

/* Why no token budget fits, into note: the smallest budget is the longest
 * sample's length; either that sample alone does not fit (fit's own reason
 * at that length) or a batch of shorter ones under it does not. */
static void none_note(const ml_model *m, const ml_config *cfg, const ml_lengths *d, char *note,
                      size_t size)
{
    const uint64_t T = ml_lengths_max(d);
    ml_config c = *cfg;
    c.training.seq_len = T;
    c.training.micro_batch = 1;
    ml_fit_request fq = ml_fit_request_defaults();
    fq.max_micro_batch = 1;
    ml_fit_result fr;
    ml_error e;
    if (ml_fit(m, &c, &fq, &fr, &e) == ML_OK && !fr.fits) {
        snprintf(note, size, "even one sample of the longest length (%llu tokens) does not "
                             "fit: %s", (unsigned long long)T, fr.note);
        return;
    }
    ml_lengths_request rq = ml_lengths_request_defaults();
    rq.max_tokens = T;
    ml_lengths_result r;
    if (ml_lengths_plan(m, cfg, d, &rq, &r, &e) == ML_OK && !r.max.fits) {
        snprintf(note, size, "no token budget fits: the smallest, the longest sample's %llu "
                             "tokens, already makes a batch of %llu samples of %llu tokens that "
                             "does not fit (memledger triage --lengths ... --max-tokens %llu "
                             "ranks the changes)",
                 (unsigned long long)T, (unsigned long long)r.max.micro_batch,
                 (unsigned long long)r.max.seq_len, (unsigned long long)T);
        return;
    }
    snprintf(note, size, "no token budget fits, down to the longest sample's %llu tokens",
             (unsigned long long)T);
}

/* fit --max-tokens auto where no token budget fits: the verdict on stdout
 * as fit's, with the reason (JSON: max_tokens null, fits false, note), and
 * on stderr. */
static int write_none(const ml_cli_opts *o, const ml_model *m, const ml_config *cfg,
                      const ml_lengths *d, const ml_lengths_request *req)
{
    ml_out out;
    int rc = ml_out_open_report(&out, o->output, o->format == ML_FMT_TEXT, m, cfg);
    if (rc)
        return rc;
    FILE *f = out.f;
    char note[1024];
    none_note(m, cfg, d, note, sizeof note);
    ml_cli_decorate(o, note, sizeof note); /* (the flags' words) */
    if (o->format == ML_FMT_JSON) {
        fit_json_head(f, m, cfg);
        fprintf(f, "{\"batching\": \"%s\", \"max_tokens\": null, \"samples\": %llu, "
                   "\"min\": %llu, \"max\": %llu, \"fits\": false, \"note\": ",
                ml_batching_name(req->batching), (unsigned long long)ml_lengths_samples(d),
                (unsigned long long)ml_lengths_min(d), (unsigned long long)ml_lengths_max(d));
        ml_json_put_string(f, note);
        fputs("}}\n", f);
    } else {
        fit_text_head(f, m, cfg);
        fprintf(f, "DOES NOT FIT: %s\n", note);
    }
    rc = ml_out_close(&out, !ferror(f));
    if (!rc) {
        fputs("memledger: fit --max-tokens auto: ", stderr);
        ml_cli_put_safe(stderr, note, strlen(note), false);
        fputc('\n', stderr);
    }
    return rc;
}

int ml_cli_fit_lengths(const ml_cli_opts *o, const ml_model *m, const ml_config *cfg)
{
    /* what fit --lengths does not use is refused, never ignored */
    const char *unused = o->global_batch      ? "--global-batch"
                         : o->max_micro_batch ? "--max-micro-batch"
                         : o->emit            ? "--emit"
                         : o->auto_checkpoint ? "--checkpoint auto"
                                              : NULL;
    if (o->seq_len) {
        ml_cli_errorf("fit --lengths: --seq-len is not used with a length distribution (its "
                      "lengths give each batch's sequence); drop it");
        return ML_EXIT_BAD_INPUT;
    }
    if (unused) {
        ml_cli_errorf("fit --lengths: %s is not used with a length distribution (the token "
                      "budget or the micro-batch per bucket is the answer); drop it",
                      unused);
        return ML_EXIT_BAD_INPUT;
    }
    ml_lengths *d;
    ml_lengths_request req;
    bool auto_tokens;
    int rc = lengths_request(o, &d, &req, &auto_tokens);
    if (rc)
        return rc;
    if (!auto_tokens && req.batching != ML_BATCHING_BUCKETED) {
        ml_cli_errorf("fit --lengths: give --max-tokens auto (the largest token budget whose "
                      "worst batch fits) or --batching bucketed (the micro-batch per bucket)");
        ml_lengths_destroy(d);
        return ML_EXIT_BAD_INPUT;
    }
    ml_error e;
    ml_status st = ML_OK;
    if (!cfg->device.present) {
        ml_cli_errorf("fit needs a device (--device NAME|SIZE or a device: section)");
        rc = ML_EXIT_BAD_INPUT;
        goto out;
    }
    ml_lengths_result r;
    /* the budget searched and planned (its points simulated once), or the
     * one given planned */
    st = auto_tokens ? ml_lengths_fit_tokens_plan(m, cfg, d, &req.max_tokens, &r, &e)
                     : ml_lengths_plan(m, cfg, d, &req, &r, &e);
    if (st) {
        rc = ml_cli_lengths_failed(o, &e, st);
        goto out;
    }
    if (auto_tokens && !req.max_tokens) {
        rc = write_none(o, m, cfg, d, &req);
        if (!rc)
            rc = ML_EXIT_NO_FIT;
        goto out;
    }
    rc = write_report(o, m, cfg, NULL, d, &req, &r, auto_tokens);
    if (!rc)
        rc = r.p_over_budget > 0 || !r.max.fits ? ML_EXIT_NO_FIT : ML_EXIT_OK;
out:
    ml_lengths_destroy(d);
    return rc;
}
