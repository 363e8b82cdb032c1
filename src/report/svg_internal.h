/* Shared by the SVG and HTML writers. */
#ifndef ML_SVG_INTERNAL_H
#define ML_SVG_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "memledger/ledger.h"

#define ML_SVG_POINTS 1500
/* The timeline chart's plot area in SVG units (viewBox 1040 x 580). */
#define ML_SVG_X0 90.0
#define ML_SVG_W 720.0
/* compare's and colocate's width (the plot ends at x 810), and their legend:
 * its first line's baseline below the plot area (clear of the x axis's
 * ticks and caption), the line spacing, the room under the last line, the
 * swatch's length and where the entries' text starts. */
#define ML_SVG_WIDTH 840.0
#define ML_SVG_LEGEND_GAP 64.0
#define ML_SVG_LEGEND_LINE 17.0
#define ML_SVG_LEGEND_PAD 12.0
#define ML_SVG_SWATCH 26.0
#define ML_SVG_LEGEND_TEXT_X 54.0

/* A chart's plot area in SVG units and the top of its byte axis. */
typedef struct ml_svg_chart {
    double x0, y0, w, h;
    double ymax;
} ml_svg_chart;

/* The SVG element with a white background, w x h units. */
void ml__svg_header(FILE *f, int w, int h);
/* y of a byte count on c. */
double ml__svg_py(const ml_svg_chart *c, double bytes);
/* The byte axis (a binary unit, 4 to 10 ticks) and the x axis line. */
void ml__svg_y_axis(FILE *f, const ml_svg_chart *c);
/* A horizontal line at `bytes`, labelled at its right end (or left). */
void ml__svg_hline(FILE *f, const ml_svg_chart *c, uint64_t bytes, const char *color,
                   const char *dash, const char *label, bool left);

/* ml_svg_escape on the first len bytes of s (or up to its NUL). */
void ml__svg_escape_n(FILE *f, const char *s, size_t len);
/* An upper bound on the width, in SVG units, of the first len bytes of s
 * set in DejaVu Sans (Bold) at font-size `size` (its advance widths;
 * kerning only narrows a line). */
double ml__svg_text_width(const char *s, size_t len, double size, bool bold);
/* Writes s as <text> lines from (x, y) down, line_h apart, each at most
 * max_w wide (ml__svg_text_width): broken at a space where there is one,
 * else between characters; attrs (or NULL) goes into each element. f NULL:
 * writes nothing. Returns the number of lines (at least 1). */
int ml__svg_text_wrapped(FILE *f, double x, double y, double line_h, double size, bool bold,
                         const char *attrs, double max_w, const char *s);
/* One legend entry at baseline y (see ML_SVG_LEGEND_*): a stroke of the
 * curve's colour and dash ("" solid) when dash is not NULL, else a filled
 * square, then text wrapped to the picture's width. f NULL: writes
 * nothing. Returns the entry's number of lines. */
int ml__svg_legend_entry(FILE *f, double y, const char *color, const char *dash,
                         const char *text);
/* The x axis's ticks in seconds, 0 to T: a 1-2-5 step giving 4 to 10. */
void ml__svg_x_axis_time(FILE *f, const ml_svg_chart *c, double T);

/* The latest event time when every event has one, else 0: the chart's x
 * axis is then seconds (0..T), else the event index. */
double ml__svg_time_end(const ml_ledger *l);

/* Up to cap event indices, each the highest event of its bucket. */
size_t ml__svg_sample(const ml_ledger *l, size_t *idx, size_t cap);

/* The timeline chart's plot area and byte axis for l (as
 * ml_report_timeline_svg draws it: under the title's lines), into *c; -1
 * when out of memory. */
int ml__svg_timeline_chart(const ml_model *m, const ml_config *cfg, const ml_ledger *l,
                           ml_svg_chart *c);
/* The events the HTML report's hover reads, in event order, at most
 * ML_SVG_HOVER_POINTS into idx: every event when there are ML_SVG_POINTS
 * or fewer, else the ones the chart draws (on a time axis each column's
 * highest and last) and the highest of each of ML_SVG_POINTS runs of
 * events. */
#define ML_SVG_HOVER_POINTS (2 * ML_SVG_POINTS)
size_t ml__svg_hover_points(const ml_ledger *l, size_t *idx);

/* svg_lines.c: the device's lines over an allocator curve (with a
 * fragmentation allowance the budget / (1 + f)); the simulated reserved
 * line (training's figure, ml__svg_training_reserved); the notice that the
 * simulation ran out of the device, under the x axis's caption. */
void ml__svg_device_lines(FILE *f, const ml_svg_chart *c, const ml_summary *s,
                          const ml_device *dv);
uint64_t ml__svg_training_reserved(const ml_summary *s);
void ml__svg_reserved_line(FILE *f, const ml_svg_chart *c, const ml_summary *s);
void ml__svg_oom_notice(FILE *f, const ml_svg_chart *c, const ml_summary *s);

#endif
