/* One self-contained HTML report: configuration, verdict, ledger, the
 * timeline chart with a hover read-out, the checkpoint comparison and the
 * fit recommendation. Inline CSS and script only: no network, no external
 * files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memledger/report.h"
#include "report/report_internal.h"
#include "memledger/version.h"
#include "report/svg_internal.h"

static const char *B(uint64_t v, char *buf)
{
    ml_format_bytes(v, buf, 32);
    return buf;
}

static const char *FL(double v, char *buf)
{
    ml_format_flops(v, buf, 32);
    return buf;
}

static void row(FILE *f, const char *k, const char *v)
{
    fprintf(f, "<tr><th>%s</th><td>", k);
    ml_svg_escape(f, v);
    fputs("</td></tr>\n", f);
}

static const char css[] =
    "body{font-family:DejaVu Sans,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1100px}"
    "h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}"
    ".cfg{color:#555;font-size:13px}.verdict{display:inline-block;padding:4px 10px;border-radius:4px;"
    "font-weight:bold;color:#fff;margin:10px 0}.fits{background:#2e7d32}.nofit{background:#c62828}"
    ".nodev{background:#777}table{border-collapse:collapse;font-size:13px}"
    "td,th{border-bottom:1px solid #ddd;padding:3px 10px;text-align:right}"
    "th{text-align:left;font-weight:600}td:first-child{text-align:left}"
    "#chart{position:relative}#chart svg{width:100%;height:auto}"
    "#tip{position:absolute;display:none;background:rgba(255,255,255,.95);border:1px solid #999;"
    "padding:6px 8px;font-size:12px;pointer-events:none;white-space:nowrap}"
    "#cursor{position:absolute;top:0;width:1px;background:#333;display:none;pointer-events:none}"
    ".note{font-size:12px;color:#555}";

/* Hover: maps the mouse to the nearest x at which the chart draws events
 * and, among the events there (many share an instant: a block's
 * allocations, a spike inside a backward), to the one whose total is
 * drawn nearest the mouse's height, so that every event is reached (the
 * top of a spike is its highest), and lists its bytes. */
static const char script[] =
    "(function(){\n"
    "var P=document.getElementById('points').textContent;var pts=JSON.parse(P);\n"
    "var A=JSON.parse(document.getElementById('axis').textContent);\n"
    "var cats=['params','master weights','grads','optimizer states','saved activations',"
    "'recompute','workspace','batch','buffers'];\n"
    "function fmt(b){var u=['B','KiB','MiB','GiB','TiB'];var i=0;while(b>=1024&&i<4){b/=1024;i++;}"
    "return (i?b.toFixed(2):b)+' '+u[i];}\n"
    "function tot(p){var t=0;for(var c=0;c<cats.length;c++)t+=p[3+c];return t;}\n"
    "function yof(p){return A.y0+A.h-tot(p)/A.ymax*A.h;}\n"
    "var box=document.getElementById('chart');var svg=box.querySelector('svg');"
    "var tip=document.getElementById('tip');var cur=document.getElementById('cursor');\n"
    "box.addEventListener('mousemove',function(ev){var r=svg.getBoundingClientRect();"
    "var k=r.width/1040;var x=(ev.clientX-r.left)/k;var y=(ev.clientY-r.top)/k;"
    "if(x<" "90" "||x>" "810" "||!pts.length){tip.style.display='none';cur.style.display='none';return;}"
    "var bx=pts[0][0];for(var i=1;i<pts.length;i++){if(Math.abs(pts[i][0]-x)<Math.abs(bx-x))bx=pts[i][0];}"
    "var best=null,dy=Infinity,n=0,at=0;for(var i=0;i<pts.length;i++){if(pts[i][0]!==bx)continue;n++;"
    "var d=Math.abs(yof(pts[i])-y);if(d<dy){dy=d;best=pts[i];at=n;}}"
    "var t=tot(best);var h='<b>'+best[1]+'</b> ('+best[2]+')<br>';"
    "for(var c=0;c<cats.length;c++){if(best[3+c]>0)h+=cats[c]+': '+fmt(best[3+c])+'<br>';}"
    "h+='<b>total '+fmt(t)+'</b>';"
    "if(n>1)h+='<br><i>event '+at+' of '+n+' here: move up or down for the others</i>';"
    "tip.innerHTML=h;tip.style.display='block';"
    "var bx=box.getBoundingClientRect();var px=best[0]*k+r.left-bx.left;"
    "tip.style.left=(px+12)+'px';tip.style.top=(ev.clientY-bx.top+12)+'px';"
    "cur.style.left=px+'px';cur.style.height=r.height+'px';cur.style.display='block';});\n"
    "box.addEventListener('mouseleave',function(){tip.style.display='none';cur.style.display='none';});\n"
    "document.body.setAttribute('data-ready','1');\n"
    "})();\n";

/* The calibration line, as plan's text states it (the profile, the
 * measured c and the blocks it marks, or why it was not applied); -1 when
 * out of memory. */
static int html_calibration(FILE *f, const ml_config *cfg, const ml_summary *s)
{
    char *line = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&line, &len);
    if (!mf)
        return -1;
    ml__report_calibration(mf, cfg, s);
    if (fclose(mf) || !line) {
        free(line);
        return -1;
    }
    fputs("<div class=\"cfg\">", f);
    ml_svg_escape(f, line);
    fputs("</div>\n", f);
    free(line);
    return 0;
}

/* The title, the configuration line, the calibration and the verdict; -1
 * when out of memory. */
static int html_head(FILE *f, const ml_model *m, const ml_config *cfg, const ml_summary *s)
{
    char a[32], b[32], ck[1200], buf[256];
    ml_checkpoint_format(&cfg->training.checkpoint, ck, sizeof ck);
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>memledger: ", f);
    ml_svg_escape(f, ml_model_name(m));
    fprintf(f, "</title>\n<style>%s</style></head><body>\n<h1>", css);
    ml_svg_escape(f, ml_model_name(m));
    fputs(" — training memory plan</h1>\n<div class=\"cfg\">", f);
    char sl[80];
    ml__report_lengths(m, &cfg->training, sl, sizeof sl);
    snprintf(buf, sizeof buf, "micro_batch %llu, %s, grad_accum %llu, %s, %s (%s), checkpoint %s",
             (unsigned long long)cfg->training.micro_batch, sl,
             (unsigned long long)cfg->training.grad_accum, ml_precision_name(cfg->training.precision),
             ml_optimizer_name(cfg->training.optimizer),
             ml_optimizer_impl_name(cfg->training.optimizer_impl), ck);
    ml_svg_escape(f, buf);
    const uint64_t dpc = cfg->training.data_parallel *
                         ml_training_cp(&cfg->training);
    if (dpc > 1 || cfg->training.zero)
        fprintf(f, ", %llu devices, ZeRO %u", (unsigned long long)dpc, cfg->training.zero);
    if (ml_training_ep(&cfg->training) > 1)
        fprintf(f, ", ep %llu", (unsigned long long)ml_training_ep(&cfg->training));
    char lay[160];
    ml__report_layout_brief(&cfg->training, lay, sizeof lay);
    ml_svg_escape(f, lay);
    fputs("</div>\n", f);
    if (cfg->calib && html_calibration(f, cfg, s))
        return -1;
    if (s->has_device) {
        fprintf(f, "<div class=\"verdict %s\">%s</div> ", s->fits ? "fits" : "nofit",
                s->fits ? "FITS" : "DOES NOT FIT");
        char c1[32], c2[32];
        char c3[64] = "";
        if (s->fragmentation) {
            /* the cache over the peak: the allowance given, else the
             * simulated reserved peak's, as plan's text names them */
            char fr[32];
            snprintf(c3, sizeof c3, " + %s %s",
                     cfg->device.fragmentation > 0 ? "fragmentation allowance"
                     : s->has_reserved            ? "allocator cache"
                                                  : "fragmentation",
                     B(s->fragmentation, fr));
        }
        /* the peak that binds, which the device total is made from */
        fprintf(f, "<span class=\"cfg\">%s %s%s + runtime reserve %s = device total %s on the "
                   "device's %s, budget %s; ",
                s->binding == ML_PEAK_EVAL              ? "evaluation peak"
                : s->binding == ML_PEAK_FIRST_ITERATION ? "first-iteration peak"
                                                        : "allocator peak",
                B(ml_summary_binding_peak(s), a), c3, B(s->runtime_reserve, b),
                B(s->peak_total, buf), B(s->memory, c1), B(s->budget, c2));
        if (s->fits)
            fprintf(f, "headroom %s</span>\n", B((uint64_t)s->headroom, b));
        else if (s->reserved_oom && s->headroom == -1)
            fputs("the simulated caching allocator runs out of the device</span>\n", f);
        else
            fprintf(f, "over by %s</span>\n", B((uint64_t)(-s->headroom), b));
    } else {
        fputs("<div class=\"verdict nodev\">no device given</div>\n", f);
    }
    return 0;
}

/* The summary table: the model states, the peaks, the FLOPs, the time. */
static void html_summary(FILE *f, const ml_config *cfg, const ml_summary *s)
{
    char a[32], b[32], c[32], buf[256];
    fputs("<h2>Summary</h2>\n<table>\n", f);
    ml__report_commas(s->params, buf, sizeof buf);
    row(f, "parameters", buf);
    row(f, "params", B(s->bytes_params, a));
    row(f, "master weights", B(s->bytes_master, a));
    row(f, "grads", B(s->bytes_grads, a));
    row(f, "optimizer states", B(s->bytes_optimizer, a));
    row(f, "step temporaries (optimizer step only)", B(s->bytes_step_temp, a));
    if (s->bytes_host)
        row(f, "offloaded to the host", B(s->bytes_host, a));
    row(f, "saved activations (end of forward)", B(s->bytes_activations, a));
    snprintf(buf, sizeof buf, "%s during %s at %s", B(s->peak, a), ml_phase_name(s->peak_phase),
             s->peak_step);
    row(f, "allocator peak", buf);
    row(f, "first iteration's peak (optimizer states created by its step)",
        B(s->peak_first_iteration, a));
    if (s->has_eval)
        row(f, "evaluation pass's peak (no_grad)", B(s->peak_eval, a));
    if (s->has_reserved) {
        snprintf(buf, sizeof buf, "%s in %llu segments (%s allocator simulated)%s",
                 B(s->reserved_peak, a), (unsigned long long)s->reserved_segments,
                 ml_allocator_name(cfg->device.allocator),
                 s->reserved_oom ? "; out of memory on the device" : "");
        row(f, "reserved (max_memory_reserved)", buf);
    }
    row(f, "device total (the binding allocator peak, allowance or reserved, runtime reserve)",
        B(s->peak_total, a));
    snprintf(buf, sizeof buf, "forward %s, backward %s, recompute %s", FL(s->flops_forward, a),
             FL(s->flops_backward, b), FL(s->flops_recompute, c));
    row(f, "FLOPs per iteration", buf);
    if (s->step_time_s >= 0) {
        snprintf(buf, sizeof buf, "%.4g s%s", s->step_time_s,
                 s->time.source == ML_TIME_CALIBRATED ? " (per-op model, the profile's GEMM rates)"
                 : s->time.source == ML_TIME_DATASHEET ? " (per-op model, datasheet estimate)"
                 : s->time_measured ? " (FLOPs at the profile's measured GEMM throughput)"
                                    : " (FLOPs at the peak: a lower bound)");
        row(f, "estimated step time", buf);
    }
    fputs("</table>\n", f);
}

/* The timeline chart (the SVG without its XML declaration) and the sampled
 * points the hover reads: [x, step, phase, live...]. -1 when the chart
 * could not be drawn. */
static int html_chart(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l)
{
    fputs("<h2>Memory over one iteration</h2>\n<div id=\"chart\">\n", f);
    char *svg = NULL;
    size_t svglen = 0;
    FILE *mf = open_memstream(&svg, &svglen);
    if (!mf)
        return -1;
    int w = ml_report_timeline_svg(mf, m, cfg, l);
    fclose(mf);
    if (w != 0 || !svg) {
        free(svg);
        return -1;
    }
    const char *body = strstr(svg, "<svg");
    fputs(body ? body : svg, f);
    free(svg);
    fputs("<div id=\"cursor\"></div><div id=\"tip\"></div></div>\n", f);
    fputs("<p class=\"note\">Hover over the chart for the step and the bytes by category.</p>\n", f);
    ml_svg_chart ch;
    if (ml__svg_timeline_chart(m, cfg, l, &ch))
        return -1;
    size_t idx[ML_SVG_HOVER_POINTS];
    size_t n = ml_ledger_event_count(l), np = ml__svg_hover_points(l, idx);
    const ml_event *ev = ml_ledger_events(l);
    double den = n > 1 ? (double)(n - 1) : 1;
    /* x as the chart places the event: at its time on a time axis, else
     * at its index */
    const double T = ml__svg_time_end(l);
    fputs("<script type=\"application/json\" id=\"points\">[", f);
    for (size_t j = 0; j < np; j++) {
        const ml_event *e = &ev[idx[j]];
        const ml_block_info *bi = e->block >= 0 ? ml_ledger_block(l, (size_t)e->block) : NULL;
        double at = T > 0 ? e->t_s / T : (double)idx[j] / den;
        fprintf(f, "%s[%.1f,\"%s\",\"%s\"", j ? "," : "", ML_SVG_X0 + at * ML_SVG_W,
                bi ? bi->name : e->phase == ML_PHASE_OPTIMIZER ? "optimizer.step" : "resident",
                ml_phase_name(e->phase));
        for (int c = 0; c < ML_CAT_COUNT; c++)
            fprintf(f, ",%llu", (unsigned long long)e->live[c]);
        fputc(']', f);
    }
    fputs("]</script>\n", f);
    /* where the chart draws a total: y = y0 + h - bytes / ymax x h */
    fprintf(f, "<script type=\"application/json\" id=\"axis\">{\"y0\":%.1f,\"h\":%.1f,"
               "\"ymax\":%.17g}</script>\n",
            ch.y0, ch.h, ch.ymax);
    return 0;
}

/* The ledger: each block's parameters, saved activations and FLOPs; a
 * block whose saved bytes the calibration profile measured has a * after
 * its c. */
static void html_ledger(FILE *f, const ml_ledger *l)
{
    bool measured = false;
    char a[32], b[32];
    fputs("<h2>Ledger: saved activations per block</h2>\n<table><tr><th>block</th><th>params</th>"
          "<th>saved</th><th>c</th><th>forward FLOPs</th><th>checkpointed</th></tr>\n", f);
    for (size_t i = 0; i < ml_ledger_block_count(l); i++) {
        const ml_block_info *bi = ml_ledger_block(l, i);
        fputs("<tr><td>", f);
        ml_svg_escape(f, bi->name);
        fprintf(f, "</td><td>%llu</td><td>%s</td><td>%.3f%s</td><td>%s</td><td>%s</td></tr>\n",
                (unsigned long long)bi->params, B(bi->activations_saved, a), bi->c,
                bi->measured ? "*" : "", FL(bi->flops_forward, b), bi->checkpointed ? "yes" : "");
        measured |= bi->measured;
    }
    fputs("</table>\n", f);
    if (measured)
        fputs("<p class=\"note\">* c measured by the calibration profile (the calibration line "
              "above), not derived.</p>\n",
              f);
}

/* The checkpoint policies compared (nothing when nrows is 0), and the
 * optimal plans' notes. */
static void html_compare(FILE *f, const ml_compare_row *rows, size_t nrows)
{
    char a[32], b[32], c[32];
    if (!nrows)
        return;
    fputs("<h2>Checkpoint policies</h2>\n<table><tr><th>policy</th><th>device total</th>"
          "<th>saved activations</th><th>recompute</th><th>% of 3F</th><th>step time</th>"
          "<th>fits</th></tr>\n",
          f);
    for (size_t i = 0; i < nrows; i++) {
        const ml_compare_row *r = &rows[i];
        char name[64], st[32];
        ml_checkpoint_format(&r->checkpoint, name, sizeof name);
        if (r->step_time_s >= 0)
            snprintf(st, sizeof st, "%.4g s", r->step_time_s);
        else
            snprintf(st, sizeof st, "-");
        fprintf(f, "<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%.1f%%</td><td>%s</td>"
                   "<td>%s</td></tr>\n",
                name, B(r->peak_total, a), B(r->activations_saved, b),
                FL(r->flops_recompute, c), r->recompute_pct, st,
                !r->has_device ? "-" : r->fits ? "yes" : "no");
    }
    fputs("</table>\n", f);
    for (size_t i = 0; i < nrows; i++)
        if (rows[i].checkpoint.kind == ML_CKPT_OPTIMAL) {
            fputs("<p class=\"note\">", f);
            ml_svg_escape(f, rows[i].plan);
            fputs("</p>\n", f);
        }
}

/* The fit's recommendation (nothing without one). */
static void html_fit(FILE *f, const ml_fit_result *fit)
{
    char a[32];
    if (!fit)
        return;
    fputs("<h2>Micro-batch and accumulation</h2>\n<p>", f);
    if (fit->fits) {
        char name[64];
        ml_checkpoint_format(&fit->checkpoint, name, sizeof name);
        fprintf(f, "Largest micro-batch that fits: <b>%llu</b> (checkpoint %s). Recommended: "
                   "micro-batch %llu &times; %llu accumulation steps &times; %llu device%s = "
                   "effective batch %llu; device total %s.",
                (unsigned long long)fit->max_micro_batch, name,
                (unsigned long long)fit->micro_batch, (unsigned long long)fit->grad_accum,
                (unsigned long long)fit->data_parallel, fit->data_parallel == 1 ? "" : "s",
                (unsigned long long)fit->effective_batch, B(fit->peak_total, a));
    } else {
        fputs("Even micro-batch 1 does not fit. ", f);
    }
    if (fit->note[0]) {
        fputs(" ", f);
        ml_svg_escape(f, fit->note);
    }
    fputs("</p>\n", f);
}

int ml_report_html(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l,
                   const ml_compare_row *rows, size_t nrows, const ml_fit_result *fit)
{
    const ml_summary *s = ml_ledger_summary(l);
    if (html_head(f, m, cfg, s))
        return -1;
    html_summary(f, cfg, s);
    if (html_chart(f, m, cfg, l))
        return -1;
    html_ledger(f, l);
    html_compare(f, rows, nrows);
    html_fit(f, fit);
    fputs("<p class=\"note\">memledger " ML_VERSION ": every figure is derived in the project's docs/ "
          "(inventory, ledger, FLOPs).</p>\n",
          f);
    fprintf(f, "<script>\n%s</script>\n</body></html>\n", script);
    return ferror(f) ? -1 : 0;
}
