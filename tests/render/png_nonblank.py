#!/usr/bin/python3
"""Exits 0 when a PNG decodes and is not blank: at least two colours and
enough non-background pixels. Standard library only (zlib)."""
import struct
import sys
import zlib


def pixels(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit("%s: not a PNG" % path)
    pos, idat, w, h, ctype, depth = 8, b"", 0, 0, 0, 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    if depth != 8 or ctype not in (2, 6):
        raise SystemExit("%s: expected 8-bit RGB or RGBA, got depth %d type %d" % (path, depth, ctype))
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    prev = bytearray(stride)
    out = []
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out.append(bytes(line))
        prev = line
    return w, h, bpp, out


def main():
    w, h, bpp, rows = pixels(sys.argv[1])
    colours = set()
    background = rows[0][:3]
    other = 0
    for row in rows[:: max(1, h // 200)]:
        for x in range(0, w * bpp, bpp * max(1, w // 300)):
            px = row[x:x + 3]
            colours.add(px)
            if px != background:
                other += 1
    if len(colours) < 4 or other < 50:
        raise SystemExit("%s: blank (%d colours, %d non-background samples)" % (sys.argv[1], len(colours), other))
    print("%s: %dx%d, %d colours sampled, %d non-background samples" % (sys.argv[1], w, h, len(colours), other))


if __name__ == "__main__":
    main()
