/* The SVG writers' text: XML escaping, and widths from the font's own
 * metrics so that a label is wrapped before it leaves the picture (the
 * legends of compare and colocate). tests/render/svg_text_fits.py checks the
 * pictures with the same font. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "memledger/report.h"
#include "report/svg_internal.h"
#include "util/utf8.h"

/* XML 1.0's Char production (section 2.2) allows tab, LF, CR, U+0020 to
 * U+D7FF, U+E000 to U+FFFD and U+10000 to U+10FFFF: a control byte is
 * dropped (a name's tab or newline means nothing in a label), and a byte
 * that is not UTF-8, or U+FFFE or U+FFFF (EF BF BE, EF BF BF), becomes
 * U+FFFD, as the JSON writers do; ml_utf8_len already refuses surrogates
 * and anything above U+10FFFF. */
void ml__svg_escape_n(FILE *f, const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + len;
    while (p < end && *p) {
        const size_t n = ml_utf8_len(p);
        switch (*p) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default:
            if (!n || (n == 3 && p[0] == 0xEF && p[1] == 0xBF && p[2] >= 0xBE))
                fputs("\xEF\xBF\xBD", f); /* U+FFFD */
            else if (*p >= 0x20)
                fwrite(p, 1, n, f);
        }
        p += n ? n : 1;
    }
}

void ml_svg_escape(FILE *f, const char *s)
{
    ml__svg_escape_n(f, s, strlen(s));
}

/* DejaVu Sans, the first font the SVGs name: the advance widths of ASCII
 * U+0020 to U+007E in its units (2048 per em), from the font's hmtx table
 * (DejaVuSans.ttf 2.37); any other character counts as the font's widest
 * advance (3838), so that a width is never underestimated. Kerning only
 * narrows a line. tests/render/svg_text_fits.py measures the same font. */
static const unsigned short dejavu_advance[95] = {
    651,  821,  942,  1716, 1303, 1946, 1597, 563,  799,  799,  1024, 1716,
    651,  739,  651,  690,  1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303,
    1303, 1303, 690,  690,  1716, 1716, 1716, 1087, 2048, 1401, 1405, 1430,
    1577, 1294, 1178, 1587, 1540, 604,  604,  1343, 1141, 1767, 1532, 1612,
    1235, 1612, 1423, 1300, 1251, 1499, 1401, 2025, 1403, 1251, 1403, 799,
    690,  799,  1716, 1024, 1024, 1255, 1300, 1126, 1300, 1260, 721,  1300,
    1298, 569,  569,  1186, 569,  1995, 1298, 1253, 1300, 1300, 842,  1067,
    803,  1298, 1212, 1675, 1212, 1212, 1075, 1303, 690,  1303, 1716};
/* ... and of DejaVu Sans Bold (DejaVuSans-Bold.ttf), whose widest is 4129 */
static const unsigned short dejavu_bold_advance[95] = {
    713,  934,  1067, 1716, 1425, 2052, 1786, 627,  936,  936,  1071, 1716,
    778,  850,  778,  748,  1425, 1425, 1425, 1425, 1425, 1425, 1425, 1425,
    1425, 1425, 819,  819,  1716, 1716, 1716, 1188, 2048, 1585, 1561, 1503,
    1700, 1399, 1399, 1681, 1714, 762,  762,  1587, 1305, 2038, 1714, 1741,
    1501, 1741, 1577, 1475, 1397, 1663, 1585, 2259, 1579, 1483, 1485, 936,
    748,  936,  1716, 1024, 1024, 1382, 1466, 1214, 1466, 1389, 891,  1466,
    1458, 702,  702,  1362, 702,  2134, 1458, 1407, 1466, 1466, 1010, 1219,
    979,  1458, 1335, 1892, 1321, 1335, 1192, 1458, 748,  1458, 1716};
#define DEJAVU_WIDEST 3838
#define DEJAVU_BOLD_WIDEST 4129
#define DEJAVU_EM 2048.0

/* One character's advance at p (len bytes in *n, at least 1). */
static unsigned advance(const unsigned char *p, bool bold, size_t *n)
{
    size_t k = ml_utf8_len(p);
    *n = k ? k : 1;
    if (*p >= 0x20 && *p <= 0x7E)
        return bold ? dejavu_bold_advance[*p - 0x20] : dejavu_advance[*p - 0x20];
    return bold ? DEJAVU_BOLD_WIDEST : DEJAVU_WIDEST;
}

double ml__svg_text_width(const char *s, size_t len, double size, bool bold)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + len;
    unsigned long long units = 0;
    while (p < end && *p) {
        size_t n;
        units += advance(p, bold, &n);
        p += n;
    }
    return (double)units * size / DEJAVU_EM;
}

int ml__svg_text_wrapped(FILE *f, double x, double y, double line_h, double size, bool bold,
                         const char *attrs, double max_w, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    int lines = 0;
    const double max_units = max_w / size * DEJAVU_EM;
    do {
        /* the longest prefix within max_w, and its last space */
        const unsigned char *q = p, *space = NULL;
        double units = 0;
        while (*q) {
            size_t n;
            unsigned a = advance(q, bold, &n);
            if (units + a > max_units && q > p)
                break;
            if (*q == ' ' && q > p)
                space = q;
            units += a;
            q += n;
        }
        const unsigned char *stop = *q && space ? space : q;
        if (f) {
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%g\"%s%s>", x,
                    y + line_h * lines, size, bold ? " font-weight=\"bold\"" : "",
                    attrs ? attrs : "");
            ml__svg_escape_n(f, (const char *)p, (size_t)(stop - p));
            fputs("</text>\n", f);
        }
        lines++;
        p = stop;
        while (*p == ' ')
            p++;
    } while (*p);
    return lines;
}

/* The legend under a chart: per entry a swatch (a stroke of the curve's
 * colour and dash when dash is not NULL, else a filled square) and its text
 * wrapped to the chart's width. f NULL: only counts the lines. Returns the
 * number of lines. */
int ml__svg_legend_entry(FILE *f, double y, const char *color, const char *dash, const char *text)
{
    if (f && dash)
        fprintf(f, "<line x1=\"20\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                   "stroke-width=\"2.5\"%s%s%s/>\n",
                y - 4, 20.0 + ML_SVG_SWATCH, y - 4, color, *dash ? " stroke-dasharray=\"" : "",
                dash, *dash ? "\"" : "");
    else if (f)
        fprintf(f, "<rect x=\"20\" y=\"%.1f\" width=\"14\" height=\"10\" fill=\"%s\"/>\n", y - 10,
                color);
    return ml__svg_text_wrapped(f, ML_SVG_LEGEND_TEXT_X, y, ML_SVG_LEGEND_LINE, 12, false, NULL,
                                ML_SVG_WIDTH - 20 - ML_SVG_LEGEND_TEXT_X, text);
}
