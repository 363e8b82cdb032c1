#!/usr/bin/env python3
"""The web page against the command line: headless Chromium loads the built
page (scripts/web.sh) for several presets, a pasted config and settings
given through the address, and every figure the page shows (each carries
its verb, JSON key and exact value) must equal the one `memledger VERB
--format json` prints for the same inputs; a bad model shows the command
line's message; the page requests nothing beyond its own files (Chromium's
network log). Prints the bench figures: the .wasm's size, the time to the
first plan, the time per re-plan.

Usage: page_test.py BUILD_WEB_DIR MEMLEDGER_EXECUTABLE [--bench]"""
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "models")
# the page's inputs (address keys) -> the command line's flags
FLAGS = {"micro_batch": "--micro-batch", "seq_len": "--seq-len", "grad_accum": "--grad-accum",
         "precision": "--precision", "optimizer": "--optimizer", "checkpoint": "--checkpoint",
         "tp": "--tp", "pp": "--pp", "dp": "--dp", "zero": "--zero", "device": "--device",
         "allocator": "--allocator", "attention": "--attention", "interconnect": "--interconnect",
         "gpus": "--gpus", "global_batch": "--global-batch", "gpus_per_node": "--gpus-per-node",
         "network": "--network", "engine": "--engine", "vpp": "--vpp", "dp_shard": "--dp-shard",
         "cp": "--cp", "ep": "--ep", "etp": "--etp",
         "expert_capacity": "--expert-capacity"}
# the layout search's own inputs, and what it chooses itself
SEARCH = {"gpus", "global_batch", "gpus_per_node", "network"}
SEARCHED = {"micro_batch", "grad_accum", "checkpoint", "tp", "cp", "ep", "pp", "vpp", "dp", "zero",
            "dp_shard", "dist_optimizer"}
PAGE_FILES = {"/", "/index.html", "/app.js", "/memledger.js", "/memledger.wasm", "/presets.js",
              "/style.css"}
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(directory):
    handler = functools.partial(Quiet, directory=directory)
    handler.extensions_map = dict(Quiet.extensions_map, **{".wasm": "application/wasm",
                                                            ".js": "text/javascript"})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("FAIL no Chromium (apt-get install chromium)")


def load(url, netlog=None, real_time=False):
    """The page's DOM once its script has planned (virtual time lets the
    WebAssembly load and the plan finish before the dump; real_time: the
    wall clock instead, for timings, which virtual time stops while a
    script runs)."""
    with tempfile.TemporaryDirectory() as profile:
        # the browser's own traffic (updates, time, safe browsing) off: the
        # log is then the page's
        cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--disable-domain-reliability", "--no-default-browser-check",
               "--disable-client-side-phishing-detection", "--disable-features=Translate,"
               "OptimizationHints,MediaRouter,NetworkTimeServiceQuerying",
               "--user-data-dir=" + profile, "--dump-dom", url]
        cmd.insert(-2, "--timeout=20000" if real_time else "--virtual-time-budget=20000")
        if netlog:
            cmd.insert(1, "--log-net-log=" + netlog)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return out.stdout


def figures(dom):
    """(src, key, value) of every figure the page shows."""
    out = []
    for m in re.finditer(r'<[^>]*\bdata-src="([a-z]+)"[^>]*>', dom):
        tag = m.group(0)
        key = re.search(r'data-key="([^"]*)"', tag).group(1)
        raw = re.search(r'data-value="([^"]*)"', tag).group(1)
        out.append((m.group(1), key, json.loads(raw.replace("&quot;", '"').replace("&amp;", "&"))))
    return out


def lookup(doc, key):
    for part in key.split("."):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def cli(exe, verb, model_args, settings):
    """The page's verb on the command line: layouts is fit --gpus."""
    args = [exe, "fit" if verb == "layouts" else verb] + model_args
    for k, v in settings.items():
        if verb == "compare" and k == "checkpoint":
            continue
        if verb == "fit" and k == "micro_batch":
            continue
        if (verb == "layouts" and k in SEARCHED) or (verb != "layouts" and k in SEARCH):
            continue
        if k == "dist_optimizer":  # a flag without a value
            args.append("--dist-optimizer" if v == "true" else "--no-dist-optimizer")
            continue
        if k == "expert_pad":  # a switch
            if v == "true":
                args.append("--expert-pad")
            continue
        args += [FLAGS[k], v]
    out = subprocess.run(args + ["--format", "json"], capture_output=True, text=True)
    return out.returncode, out.stdout, out.stderr


def body_attr(dom, name):
    m = re.search(r'<body[^>]*\bdata-%s="([^"]*)"' % name, dom)
    return m.group(1) if m else None


def one_case(base, exe, name, page, model_args, settings, netlog=None):
    q = dict(page, **settings)
    dom = load(base + "#" + urllib.parse.urlencode(q), netlog)
    check(body_attr(dom, "state") == "done", "%s: the page planned" % name)
    figs = figures(dom)
    docs = {}
    for verb in ("plan", "compare", "fit") + (("layouts",) if "gpus" in settings else ()):
        rc, out, err = cli(exe, verb, model_args, settings)
        docs[verb] = json.loads(out) if rc in (0, 1) and out.strip() else None
    if "gpus" in settings:
        n = len(docs["layouts"]["layouts"]) if docs["layouts"] else -1
        shown = len({k.split(".")[1] for src, k, v in figs if src == "layouts"})
        check(n > 0 and shown == n, "%s: the page lists the search's %d layouts (%d shown)"
              % (name, n, shown))
    counts = {}
    bad = []
    for src, key, value in figs:
        counts[src] = counts.get(src, 0) + 1
        want = lookup(docs[src], key) if docs.get(src) is not None else "(no CLI report)"
        if want != value:
            bad.append("%s %s: page %r, CLI %r" % (src, key, value, want))
    check(not bad and counts.get("plan", 0) >= 20 and counts.get("compare", 0) >= 4,
          "%s: %d figures (%s) equal the CLI's%s" % (
              name, len(figs), ", ".join("%s %d" % kv for kv in sorted(counts.items())),
              "" if not bad else ": " + "; ".join(bad[:5])))
    # fit runs where the plan has a device (given, or the model file's own)
    has_device = docs["plan"] is not None and docs["plan"]["device"]["memory"] is not None
    fits = bool(docs["fit"] and docs["fit"]["fits"])
    check(counts.get("fit", 0) == ((2 if fits else 1) if has_device else 0),
          "%s: fit's answer shown (%s)" % (name, "no device" if not has_device else
                                           "micro-batch %s" % docs["fit"]["micro_batch"]
                                           if fits else "nothing fits"))
    return dom


def error_case(base, exe, name, text, fname):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, fname)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        out = subprocess.run([exe, "plan", fname], capture_output=True, text=True, cwd=d)
    want = out.stderr.rstrip("\n")
    prefix = "memledger: error: "
    want = want[len(prefix):] if want.startswith(prefix) else want
    dom = load(base + "#" + urllib.parse.urlencode({"text": text, "name": fname}))
    m = re.search(r'<div id="error"[^>]*>(.*?)</div>', dom, re.S)
    got = m.group(1) if m else ""
    got = got.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")
    check(out.returncode == 2 and got == want and body_attr(dom, "state") == "error",
          "%s: the page shows the CLI's message %r (page: %r)" % (name, want, got))


def requests(netlog, origin):
    """The URLs the page asked for: the network log's requests whose
    initiator is the page's origin (the browser's own traffic, updates and
    the like, is initiated by no page), and the navigation itself."""
    with open(netlog, encoding="utf-8", errors="replace") as f:
        log = json.load(f)
    out = set()
    for e in log.get("events", []):
        p = e.get("params") or {}
        if "url" in p and "method" in p and (p.get("initiator") == origin or
                                             p["url"].startswith(origin + "/#")):
            out.add(p["url"])
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    web, exe = sys.argv[1], os.path.abspath(sys.argv[2])
    bench = "--bench" in sys.argv[3:]
    server = serve(web)
    base = "http://127.0.0.1:%d/" % server.server_address[1]
    qwen = os.path.join(MODELS, "hf", "qwen2-0.5b", "config.json")
    with open(qwen, encoding="utf-8") as f:
        qwen_text = f.read()
    with tempfile.TemporaryDirectory() as tmp:
        netlog = os.path.join(tmp, "net.json")
        one_case(base, exe, "gpt2-small preset", {"model": "gpt2-small.yaml"},
                 [os.path.join(MODELS, "gpt2-small.yaml")],
                 {"micro_batch": "4", "device": "h100-sxm"}, netlog)
        urls = requests(netlog, base.rstrip("/"))
        outside = sorted(u for u in urls if not u.startswith(base) and not u.startswith("data:"))
        paths = {urllib.parse.urlparse(u).path for u in urls if u.startswith(base)}
        check(not outside and paths <= PAGE_FILES,
              "the page requests only its own files (%s)%s" % (
                  ", ".join(sorted(paths)), "; outside: " + ", ".join(outside) if outside else ""))
    one_case(base, exe, "llama-2-7b, bf16-master, full checkpointing, expandable segments",
             {"model": "llama-2-7b.yaml"}, [os.path.join(MODELS, "llama-2-7b.yaml")],
             {"micro_batch": "2", "precision": "bf16-master", "checkpoint": "full",
              "device": "a100-80gb", "allocator": "expandable"})
    one_case(base, exe, "gpt2-medium, sdpa, selective, the model file's device",
             {"model": "gpt2-medium.yaml"}, [os.path.join(MODELS, "gpt2-medium.yaml")],
             {"micro_batch": "2", "attention": "sdpa", "checkpoint": "selective"})
    one_case(base, exe, "Hugging Face preset mistral-7b, tensor parallel 2, context parallel 2 "
             "(flash)", {"model": "hf/mistral-7b.json"},
             ["--hf", os.path.join(MODELS, "hf", "mistral-7b", "config.json")],
             {"micro_batch": "1", "seq_len": "2048", "tp": "2", "cp": "2", "attention": "flash",
              "precision": "bf16-master", "device": "h100-sxm"})
    one_case(base, exe, "Hugging Face preset mixtral-8x7b, expert parallel 8 of 8 "
             "data-parallel ranks, ZeRO 1", {"model": "hf/mixtral-8x7b.json"},
             ["--hf", os.path.join(MODELS, "hf", "mixtral-8x7b", "config.json")],
             {"micro_batch": "1", "seq_len": "2048", "dp": "8", "ep": "8", "zero": "1",
              "precision": "bf16-master", "device": "h100-sxm"})
    one_case(base, exe, "Hugging Face preset mixtral-8x7b, tensor parallel 2, expert parallel 4 "
             "with expert tensor parallel 1, capacity 1.25 padded, ZeRO 1", {"model": "hf/mixtral-8x7b.json"},
             ["--hf", os.path.join(MODELS, "hf", "mixtral-8x7b", "config.json")],
             {"micro_batch": "1", "seq_len": "2048", "tp": "2", "dp": "4", "ep": "4",
              "etp": "1", "zero": "1", "precision": "bf16-master", "device": "h100-sxm",
              "expert_capacity": "1.25", "expert_pad": "true"})
    one_case(base, exe, "a pasted config.json (Qwen2-0.5B), ZeRO 2 over 2",
             {"text": qwen_text, "hf": "1", "name": "config.json"}, ["--hf", qwen],
             {"micro_batch": "2", "seq_len": "1024", "dp": "2", "zero": "2", "device": "l4"})
    one_case(base, exe, "llama-2-7b, the layout search over 16 devices",
             {"model": "llama-2-7b.yaml"}, [os.path.join(MODELS, "llama-2-7b.yaml")],
             {"micro_batch": "1", "device": "h100-sxm", "interconnect": "450", "gpus": "16",
              "global_batch": "64", "network": "50"})
    one_case(base, exe, "gpt2-medium on Megatron's engine, tp 2 pp 2 (interleaved), the "
             "distributed optimizer over shard groups of 2 of 4", {"model": "gpt2-medium.yaml"},
             [os.path.join(MODELS, "gpt2-medium.yaml")],
             {"micro_batch": "1", "grad_accum": "8", "precision": "bf16-master",
              "attention": "eager", "engine": "megatron", "tp": "2", "pp": "2", "vpp": "2",
              "dp": "4", "dp_shard": "2", "dist_optimizer": "true", "device": "h100-sxm"})
    error_case(base, exe, "unknown key", "model:\n  type: decoder\n  layerz: 2\n", "bad.yaml")
    error_case(base, exe, "YAML syntax", "model:\n  type: decoder\n  layers: [\n", "broken.yaml")
    error_case(base, exe, "a tp the heads do not divide (refused when planned)",
               "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 8\n  ffn: 256\n"
               "  activation: gelu\n  norm: layernorm\n  vocab: 100\n  position: learned\n"
               "  max_positions: 64\n  attention: eager\ntraining:\n  micro_batch: 2\n"
               "  seq_len: 32\nparallel:\n  tp: 3\n", "split.yaml")
    if bench:
        size = os.path.getsize(os.path.join(web, "memledger.wasm"))
        # timings on the wall clock (virtual time stops while a script
        # runs): Chromium dumps the DOM at its timeout or once the page is
        # idle, which may come before the WebAssembly's first plan; tried
        # three times, else the timings are said not measured
        dom = ""
        for _ in range(3):
            dom = load(base + "#model=llama-3-8b.yaml&micro_batch=1&device=h100-sxm&replans=50",
                       real_time=True)
            if body_attr(dom, "state") == "done":
                break
        if body_attr(dom, "state") == "done":
            print("bench: memledger.wasm %d bytes (%.1f KiB); llama-3-8b: first plan done %s ms "
                  "after the page began (plan, timeline, compare, fit); re-plan %s ms each "
                  "(50 plans), wall clock" % (size, size / 1024, body_attr(dom, "first-ms"),
                                              body_attr(dom, "replan-ms")))
        else:
            print("bench: memledger.wasm %d bytes (%.1f KiB); timings not measured (Chromium "
                  "dumped the page before its first plan)" % (size, size / 1024))
    server.shutdown()
    if failures:
        print("%d check(s) failed" % len(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
