/* Reports of a plan under a length distribution: the text section and the
 * JSON "lengths" object (docs/lengths.md, docs/cli.md). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "model/model_internal.h"
#include "report/report_internal.h"

static const char *yes_no(const ml_length_point *p, bool device)
{
    return !device ? "-" : p->fits ? "yes" : "no";
}

static void point_row(FILE *f, const char *what, const ml_length_point *p, bool device)
{
    char pk[32], tot[32];
    ml_format_bytes(p->peak, pk, sizeof pk);
    ml_format_bytes(p->peak_total, tot, sizeof tot);
    fprintf(f, "  %-22s %11llu %8llu %12s %12s  %s\n", what, (unsigned long long)p->micro_batch,
            (unsigned long long)p->seq_len, pk, tot, yes_no(p, device));
}

void ml__report_lengths_verdict(const ml_lengths_result *r, ml_report_verdict *v)
{
    /* r->max: with a device the tightest row (lengths_plan.c, worse) */
    memset(v, 0, sizeof *v);
    v->p_over = r->p_over_budget;
    v->fits = !(r->p_over_budget > 0) && r->max.fits;
    v->headroom = r->max.headroom;
    v->worst_micro_batch = r->max.micro_batch;
    v->worst_seq_len = r->max.seq_len;
}

static void describe(FILE *f, const ml_config *cfg, const ml_lengths *d, const char *source,
                     const ml_lengths_request *req)
{
    fputs("\nLengths (", f);
    if (ml_lengths_samples(d))
        fprintf(f, "%s: %llu sample%s", source, (unsigned long long)ml_lengths_samples(d),
                ml_lengths_samples(d) == 1 ? "" : "s");
    else
        fprintf(f, "quantiles %s", source);
    fprintf(f, ", %llu to %llu tokens, median %llu, P99 %llu)\n",
            (unsigned long long)ml_lengths_min(d), (unsigned long long)ml_lengths_max(d),
            (unsigned long long)ml_lengths_quantile(d, 0.5),
            (unsigned long long)ml_lengths_quantile(d, 0.99));
    /* quantiles fix F at a few points only: the shape between them is an
     * assumption, said where the figures are (docs/lengths.md) */
    if (!ml_lengths_samples(d))
        fputs("assumed shape: F linear between the quantiles given (every length between two "
              "of them equally likely); a CSV of the lengths gives the real tail\n",
              f);
    switch (req->batching) {
    case ML_BATCHING_PACKED:
        fprintf(f, "packed: every batch is %llu rows of %llu tokens\n",
                (unsigned long long)cfg->training.micro_batch,
                (unsigned long long)cfg->training.seq_len);
        break;
    case ML_BATCHING_BUCKETED:
        fprintf(f, "bucketed: %u buckets of equal shares, each batch padded to its bucket's "
                   "longest length\n",
                req->buckets);
        break;
    case ML_BATCHING_PADDED:
    default:
        if (req->max_tokens)
            fprintf(f, "padded, token budget %llu per batch: micro-batch floor(%llu / longest "
                       "sample), at least 1\n",
                    (unsigned long long)req->max_tokens, (unsigned long long)req->max_tokens);
        else
            fprintf(f, "padded random batches of %llu: a batch is as long as its longest sample "
                       "(median and P99 of the longest of %llu: F(t)^%llu)\n",
                    (unsigned long long)cfg->training.micro_batch,
                    (unsigned long long)cfg->training.micro_batch,
                    (unsigned long long)cfg->training.micro_batch);
        break;
    }
}

int ml_report_lengths_text(FILE *f, const ml_config *cfg, const ml_lengths *d, const char *source,
                           const ml_lengths_request *req, const ml_lengths_result *r)
{
    const bool dev = cfg->device.present;
    describe(f, cfg, d, source, req);
    fprintf(f, "  %-22s %11s %8s %12s %12s  %s\n", "batch", "micro-batch", "seq_len", "alloc peak",
            "device total", "fits");
    if (req->batching == ML_BATCHING_BUCKETED) {
        for (size_t i = 0; i < r->nbuckets; i++) {
            const ml_length_bucket *b = &r->buckets[i];
            char what[64];
            snprintf(what, sizeof what, "%llu-%llu (%.1f %%)", (unsigned long long)b->lo,
                     (unsigned long long)b->hi, b->share * 100);
            point_row(f, what, &b->point, dev);
        }
    } else {
        const bool budget = req->batching == ML_BATCHING_PADDED && req->max_tokens;
        point_row(f, budget ? "median sample" : "median batch", &r->p50, dev);
        point_row(f, budget ? "P99 sample" : "P99 batch", &r->p99, dev);
        point_row(f, "worst batch", &r->max, dev);
    }
    if (dev) {
        if (req->batching == ML_BATCHING_PADDED && !req->max_tokens)
            fprintf(f, "longest batch that fits: %llu tokens%s\n",
                    (unsigned long long)r->longest_fit, r->longest_fit ? "" : " (none)");
        fprintf(f, "a batch goes over the device with probability %.4g %%",
                r->p_over_budget * 100);
        /* padded at a fixed micro-batch the figure is 1 - F(T_fit)^b */
        if (req->batching == ML_BATCHING_PADDED && !req->max_tokens)
            fprintf(f, " = 1 - F(%llu)^%llu, F(%llu) = %.6f",
                    (unsigned long long)r->longest_fit,
                    (unsigned long long)cfg->training.micro_batch,
                    (unsigned long long)r->longest_fit, ml_lengths_cdf(d, r->longest_fit));
        fputc('\n', f);
    }
    return ferror(f) ? -1 : 0;
}

static void point_json(FILE *f, const ml_length_point *p, bool device)
{
    fprintf(f, "{\"micro_batch\": %llu, \"seq_len\": %llu, \"peak\": %llu, \"peak_total\": %llu, "
               "\"fits\": %s}",
            (unsigned long long)p->micro_batch, (unsigned long long)p->seq_len,
            (unsigned long long)p->peak, (unsigned long long)p->peak_total,
            !device ? "null" : p->fits ? "true" : "false");
}

int ml_report_lengths_json_object(FILE *f, const ml_lengths *d, const ml_lengths_request *req,
                                  const ml_lengths_result *r)
{
    const bool dev = !isnan(r->p_over_budget);
    fprintf(f, "{\"batching\": \"%s\", \"max_tokens\": %llu, \"samples\": %llu, \"min\": %llu, "
               "\"max\": %llu,\n  \"p50_peak\": %llu, \"p99_peak\": %llu, \"max_peak\": %llu, "
               "\"p_over_budget\": ",
            ml_batching_name(req->batching), (unsigned long long)req->max_tokens,
            (unsigned long long)ml_lengths_samples(d), (unsigned long long)ml_lengths_min(d),
            (unsigned long long)ml_lengths_max(d), (unsigned long long)r->p50.peak,
            (unsigned long long)r->p99.peak, (unsigned long long)r->max.peak);
    if (dev)
        fprintf(f, "%.17g", r->p_over_budget);
    else
        fputs("null", f);
    fputs(",\n  \"p50\": ", f);
    point_json(f, &r->p50, dev);
    fputs(", \"p99\": ", f);
    point_json(f, &r->p99, dev);
    fputs(", \"worst\": ", f);
    point_json(f, &r->max, dev);
    if (req->batching == ML_BATCHING_PADDED && !req->max_tokens && dev)
        fprintf(f, ", \"longest_fit\": %llu, \"cdf_longest_fit\": %.17g",
                (unsigned long long)r->longest_fit, ml_lengths_cdf(d, r->longest_fit));
    /* how F is known: counted from samples, or assumed linear between quantiles */
    fprintf(f, ", \"cdf\": \"%s\"",
            ml_lengths_samples(d) ? "counted" : "linear-between-quantiles");
    fputs(",\n  \"buckets\": [", f);
    for (size_t i = 0; i < r->nbuckets; i++) {
        const ml_length_bucket *b = &r->buckets[i];
        fprintf(f, "%s{\"lo\": %llu, \"hi\": %llu, \"share\": %.17g, \"batch\": ", i ? ", " : "",
                (unsigned long long)b->lo, (unsigned long long)b->hi, b->share);
        point_json(f, &b->point, dev);
        fputc('}', f);
    }
    fprintf(f, "], \"evaluations\": %u}", r->evaluations);
    return ferror(f) ? -1 : 0;
}

/* The sample's shape for a report's header: its sequence (and a target's),
 * or a sequential model's input tensor. */
void ml__report_lengths(const ml_model *m, const ml_training *t, char *out, size_t size)
{
    if (m->type == ML_MODEL_SEQUENTIAL) { /* a sample is its input tensor: no sequence */
        size_t o = (size_t)snprintf(out, size, "input ");
        for (size_t i = 0; i < m->ninput && o < size; i++)
            o += (size_t)snprintf(out + o, size - o, "%s%llu", i ? "x" : "",
                                  (unsigned long long)m->input[i]);
        return;
    }
    uint64_t td = ml_model_target_len(m, t);
    if (td)
        snprintf(out, size, "seq_len %llu, target_len %llu", (unsigned long long)t->seq_len,
                 (unsigned long long)td);
    else
        snprintf(out, size, "seq_len %llu", (unsigned long long)t->seq_len);
}
