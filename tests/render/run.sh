#!/bin/sh
# Renders what people look at, with real renderers: every SVG must be
# well-formed XML (xmllint), render to a non-blank PNG (rsvg-convert), and
# show all its text inside its picture with curves that can be told apart
# (svg_text_fits.py: text extents from DejaVu Sans's own metrics); the
# HTML report must load in headless Chromium without console errors, run its
# script, and screenshot to a non-blank PNG.
set -u
exe=$1
models=$2
here=$(dirname "$0")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

svg_check() {
    name=$1
    shift
    if ! "$exe" "$@" -o "$tmp/$name.svg"; then bad "$name: memledger failed"; return; fi
    if xmllint --noout "$tmp/$name.svg"; then ok "$name.svg is well-formed XML"; else bad "$name.svg: xmllint"; fi
    if rsvg-convert "$tmp/$name.svg" -o "$tmp/$name.png" && /usr/bin/python3 "$here/png_nonblank.py" "$tmp/$name.png"; then
        ok "$name.svg renders (rsvg-convert) to a non-blank PNG"
    else
        bad "$name.svg: rendering"
    fi
    if /usr/bin/python3 "$here/svg_text_fits.py" "$tmp/$name.svg"; then
        ok "$name.svg: every text inside the viewBox, every curve drawn its own way"
    else
        bad "$name.svg: text outside the picture or curves alike"
    fi
}

svg_check gpt2-timeline timeline "$models/gpt2-small.yaml" --format svg --precision amp-bf16 --micro-batch 2 --device 8GiB --budget 6.5GiB
svg_check resnet-timeline timeline "$models/cifar10-resnet.yaml" --format svg
svg_check llama-zero3-timeline timeline "$models/llama-2-7b.yaml" --format svg --data-parallel 8 --zero 3 --grad-accum 2
svg_check gpt2-compare compare "$models/gpt2-small.yaml" --format svg --micro-batch 2 --device 8GiB
# the policies' long notes ("full, not needed: none fits") in the legend
svg_check gpt2-compare-budget compare "$models/gpt2-small.yaml" --format svg --micro-batch 8 --device 8GiB --budget 6.5GiB --peak-tflops 100
svg_check llama-zero3-compare compare "$models/llama-2-7b.yaml" --format svg --data-parallel 8 --zero 3 --device 80GiB
# a name wider than the picture: the title wraps and the chart moves down
svg_check long-name-timeline timeline "$here/long-name.yaml" --format svg --peak-tflops 1e-9
svg_check long-name-compare compare "$here/long-name.yaml" --format svg
# colocate: job names whole, however long, and a seconds axis
long_job="$models/gpt2-small.yaml --micro-batch 2 --precision amp-bf16 --optimizer adamw --peak-tflops 100 --checkpoint selective --grad-accum 4 --seq-len 512"
svg_check colocate colocate --device 24GiB --format svg "$models/gpt2-small.yaml --micro-batch 2 --peak-tflops 100" \
    "$models/cifar10-resnet.yaml --peak-tflops 100" "$long_job" "$models/mlp2.yaml --peak-tflops 100"
svg_check colocate-untimed colocate --device 24GiB --format svg "$models/gpt2-small.yaml --micro-batch 2" "$long_job"
# a name with U+FFFE and U+FFFF, which XML 1.0 forbids
xml_chars="$here/../cli/cases/timeline-svg-xml-chars/m.yaml"
svg_check xml-chars-timeline timeline "$xml_chars" --format svg
svg_check xml-chars-compare compare "$xml_chars" --format svg

"$exe" report "$models/gpt2-small.yaml" --precision amp-bf16 --micro-batch 2 --device 8GiB --budget 6.5GiB --global-batch 64 -o "$tmp/report.html" || bad "report: memledger failed"
if grep -Eo '<script[^>]+src=|<link[^>]+href=|https?://[^" ]*' "$tmp/report.html" |
    grep -v '^http://www.w3.org/2000/svg$' | grep -q .; then
    bad "report.html refers to an external resource"
else
    ok "report.html is self-contained (no src=, href=, or URLs besides the SVG namespace)"
fi
chrome() {
    timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
        --disable-background-networking --disable-component-update --disable-sync \
        --user-data-dir="$tmp/profile" "$@"
}
chrome --enable-logging=stderr --v=0 --window-size=1200,2400 --screenshot="$tmp/report.png" \
    "file://$tmp/report.html" >"$tmp/chrome.out" 2>"$tmp/chrome.err"
if grep -E 'CONSOLE' "$tmp/chrome.err" | grep -Eiq 'error|uncaught'; then
    bad "report.html: console errors"; grep CONSOLE "$tmp/chrome.err"
else
    ok "report.html loads without console errors"
fi
if [ -f "$tmp/report.png" ] && /usr/bin/python3 "$here/png_nonblank.py" "$tmp/report.png"; then
    ok "report.html screenshot is non-blank"
else
    bad "report.html screenshot"
fi
if chrome --dump-dom "file://$tmp/report.html" 2>/dev/null | grep -q 'data-ready="1"'; then
    ok "report.html's script ran to the end (hover read-out installed)"
else
    bad "report.html: the script did not run"
fi
# the hover reaches every event the chart draws: gpt2-small's own plan,
# whose peak is one of many events at one instant (a spike): over the peak's
# marker the read-out is the peak's total, the summary's "allocator peak"
# (it had been the first event of that instant's, 19.29 GiB of 22.36), and
# at the plot's foot, at the same x, another of those events
"$exe" report "$models/gpt2-small.yaml" -o "$tmp/hover.html" || bad "hover report: memledger failed"
/usr/bin/python3 - "$tmp/hover.html" "$here/hover_probe.js" <<'PY'
import sys
page, probe = sys.argv[1], sys.argv[2]
html = open(page, encoding="utf-8").read()
js = open(probe, encoding="utf-8").read()
open(page, "w", encoding="utf-8").write(html.replace("</body>", "<script>" + js + "</script></body>", 1))
PY
chrome --window-size=1200,2400 --dump-dom "file://$tmp/hover.html" >"$tmp/hover.dom" 2>/dev/null
peak=$(grep -o 'allocator peak</th><td>[^<]* during' "$tmp/hover.dom" | sed 's/.*<td>//; s/ during$//')
tip_peak=$(grep -o 'data-tip-peak="[^"]*"' "$tmp/hover.dom")
tip_foot=$(grep -o 'data-tip-foot="[^"]*"' "$tmp/hover.dom")
if [ -n "$peak" ] && printf '%s' "$tip_peak" | grep -qF "total $peak"; then
    ok "report.html: the hover over the peak's marker reads the allocator peak ($peak)"
else
    bad "report.html: the hover over the peak's marker reads '$tip_peak', not the allocator peak '$peak'"
fi
if printf '%s' "$tip_foot" | grep -q 'total ' && ! printf '%s' "$tip_foot" | grep -qF "total $peak"; then
    ok "report.html: lower at the peak's x the hover reads another event"
else
    bad "report.html: at the foot of the peak's x the hover reads '$tip_foot'"
fi
echo "$pass passed, $fail failed"
[ $fail = 0 ]
