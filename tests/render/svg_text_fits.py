#!/usr/bin/python3
"""Exits 0 when every <text> of each SVG given lies inside the SVG's viewBox
and every curve can be told from the others; else prints each offender.

A text's extent is computed from the font the SVGs name first, DejaVu Sans
(its Bold for font-weight="bold"), read from the TrueType file itself: the
advance widths of its glyphs (hmtx, through the cmap) times font-size over
unitsPerEm, placed by text-anchor (start, middle, end), and from the
baseline up by the font's ascender and down by its descender (hhea).
Kerning only narrows a line, so the width is an upper bound: a text that
passes here fits in every renderer that uses DejaVu Sans, and the narrower
Helvetica and Arial the SVGs fall back to. Standard library only.

Curves (polyline, and path with fill="none"): no two may share both their
stroke colour and their dash pattern, or a reader cannot match a curve to
its legend entry."""
import struct
import sys
import xml.etree.ElementTree as ET

FONTS = {"normal": "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
         "bold": "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf"}
NS = "{http://www.w3.org/2000/svg}"


class Font:
    def __init__(self, path):
        data = open(path, "rb").read()
        ntables = struct.unpack(">H", data[4:6])[0]
        tables = {}
        for i in range(ntables):
            tag, _, off, length = struct.unpack(">4sIII", data[12 + 16 * i:28 + 16 * i])
            tables[tag.decode("latin-1")] = data[off:off + length]
        self.upem = struct.unpack(">H", tables["head"][18:20])[0]
        hhea = tables["hhea"]
        self.ascent, self.descent = struct.unpack(">hh", hhea[4:8])
        nmetrics = struct.unpack(">H", hhea[34:36])[0]
        hmtx = tables["hmtx"]
        self.adv = [struct.unpack(">H", hmtx[4 * i:4 * i + 2])[0] for i in range(nmetrics)]
        self.cmap = self._cmap(tables["cmap"])

    @staticmethod
    def _cmap(t):
        """The Unicode BMP map (platform 3 encoding 1, format 4)."""
        n = struct.unpack(">H", t[2:4])[0]
        for i in range(n):
            plat, enc, off = struct.unpack(">HHI", t[4 + 8 * i:12 + 8 * i])
            if plat == 3 and enc == 1 and struct.unpack(">H", t[off:off + 2])[0] == 4:
                break
        else:
            raise SystemExit("no format-4 Unicode cmap")
        segx2 = struct.unpack(">H", t[off + 6:off + 8])[0]
        seg = segx2 // 2
        base = off + 14
        ends = struct.unpack(">%dH" % seg, t[base:base + segx2])
        starts = struct.unpack(">%dH" % seg, t[base + segx2 + 2:base + 2 * segx2 + 2])
        deltas = struct.unpack(">%dh" % seg, t[base + 2 * segx2 + 2:base + 3 * segx2 + 2])
        ro_at = base + 3 * segx2 + 2
        ranges = struct.unpack(">%dH" % seg, t[ro_at:ro_at + segx2])
        m = {}
        for s in range(seg):
            for c in range(starts[s], ends[s] + 1):
                if c == 0xFFFF:
                    continue
                if ranges[s] == 0:
                    g = (c + deltas[s]) & 0xFFFF
                else:
                    at = ro_at + 2 * s + ranges[s] + 2 * (c - starts[s])
                    g = struct.unpack(">H", t[at:at + 2])[0]
                    if g:
                        g = (g + deltas[s]) & 0xFFFF
                m[c] = g
        return m

    def width(self, text, size):
        units = 0
        for ch in text:
            g = self.cmap.get(ord(ch), 0)  # 0: .notdef, as a renderer draws it
            units += self.adv[min(g, len(self.adv) - 1)]
        return units * size / self.upem


def check(path, fonts):
    root = ET.parse(path).getroot()
    vb = [float(v) for v in root.get("viewBox").split()]
    x0, y0, x1, y1 = vb[0], vb[1], vb[0] + vb[2], vb[1] + vb[3]
    bad = []
    for t in root.iter(NS + "text"):
        s = "".join(t.itertext())
        size = float(t.get("font-size", "16"))
        font = fonts["bold" if t.get("font-weight") == "bold" else "normal"]
        w = font.width(s, size)
        x, y = float(t.get("x", "0")), float(t.get("y", "0"))
        anchor = t.get("text-anchor", "start")
        left = x - (w / 2 if anchor == "middle" else w if anchor == "end" else 0)
        top = y - font.ascent * size / font.upem
        bottom = y - font.descent * size / font.upem
        # half a unit of slack for the writers' one-decimal coordinates
        if left < x0 - 0.5 or left + w > x1 + 0.5 or top < y0 - 0.5 or bottom > y1 + 0.5:
            bad.append("%s: text %r spans x %.1f..%.1f, y %.1f..%.1f, outside the viewBox "
                       "%g %g %g %g" % (path, s, left, left + w, top, bottom, *vb))
    seen = {}
    for el in root.iter():
        tag = el.tag[len(NS):] if el.tag.startswith(NS) else el.tag
        if tag == "polyline" or (tag == "path" and el.get("fill") == "none"):
            key = (el.get("stroke"), el.get("stroke-dasharray"))
            if key in seen:
                bad.append("%s: two curves drawn alike (stroke %s, dash %s)" % (path, *key))
            seen[key] = True
    return bad


def main():
    fonts = {k: Font(v) for k, v in FONTS.items()}
    bad = []
    for p in sys.argv[1:]:
        bad += check(p, fonts)
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
