#!/usr/bin/env python3
"""docs/search.md's table of published Megatron-LM step times against
memledger's: Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models", arXiv 2205.05198), Table 5, the end-to-end
iteration time of four GPT models on A100 80 GB GPUs with full recomputation
(tensor parallelism alone) and with sequence parallelism and selective
recomputation.

    search-anchors.py MEMLEDGER                print the table
    search-anchors.py MEMLEDGER --check DOC    exit 1 unless DOC holds it, or
                                               a row breaks the criteria below

Each published layout is planned pinned (`memledger fit --tp --pp --vpp
--micro-batch --checkpoint`, the plain data parallelism it ran with), and
the same devices and batch are then searched freely. The criteria the
search is held to: each pinned prediction within 15 % of the published
time, and the free search's best no slower than the pinned prediction.

The layouts (the paper's Table 2) as calculon-ai/calculon stores them
(validation/seqsel/tab5/*.json and calculon/llm/validation.py at commit
caa4b11f8f, which quote the times from the paper): tensor parallelism 8,
data parallelism 1, sequence 2,048, vocabulary 51,200, the stages, virtual
stages, micro-batch and global batch of MODELS. The device figures: the
a100-80gb preset (312 TFLOP/s dense fp16), NVLink at 300 GB/s each way and
Selene's network at 25 GB/s a device (eight 200 Gb/s HDR links a node of
eight), as for the GPT-3 175B anchor above the table."""
import json
import os
import subprocess
import sys
import tempfile

BEGIN = "<!-- search-anchors: begin (scripts/search-anchors.py) -->"
END = "<!-- search-anchors: end -->"

# name, layers, hidden, heads, GPUs, global batch, pipeline stages, virtual
# stages, micro-batch; the published seconds an iteration: full
# recomputation, sequence parallelism + selective recomputation
MODELS = [
    ("22B", 48, 6144, 64, 8, 4, 1, 1, 4, 1.42, 1.10),
    ("175B", 96, 12288, 96, 64, 64, 8, 3, 1, 18.13, 13.75),
    ("530B", 105, 20480, 128, 280, 280, 35, 3, 1, 49.05, 37.83),
    ("1T", 128, 25600, 160, 512, 512, 64, 1, 1, 94.42, 71.49),
]
DEVICE = ["--device", "a100-80gb", "--interconnect", "300", "--network", "25",
          "--allocator", "none"]


def model_yaml(name, layers, hidden, heads):
    """Megatron-LM's GPT (tied embeddings, learned positions, GeLU MLP of
    4h, LayerNorm, biases), mixed precision with fp32 master weights."""
    return ("name: gpt-%s\nmodel:\n  type: decoder\n  layers: %d\n  hidden: %d\n  heads: %d\n"
            "  ffn: %d\n  activation: gelu\n  norm: layernorm\n  vocab: 51200\n"
            "  max_positions: 2048\n  position: learned\n  tied_embeddings: true\n  bias: true\n"
            "  attention: eager\n  dropout: 0.1\ntraining:\n  seq_len: 2048\n  optimizer: adamw\n"
            "  engine: megatron\n  precision: fp16-master\n"
            % (name, layers, hidden, heads, 4 * hidden))


def fit(exe, path, gpus, batch, extra):
    args = [exe, "fit", path, "--gpus", str(gpus), "--global-batch", str(batch),
            "--format", "json"] + DEVICE + extra
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("FAIL %s\n%s" % (" ".join(args), out.stderr))
    d = json.loads(out.stdout)
    if not d["layouts"]:
        sys.exit("FAIL no layout fits: %s" % " ".join(args))
    return d


def layout(row):
    """The compact form fit prints: tp, cp, pp, vpp, dp."""
    return "tp%d%s.pp%d%s.dp%d" % (row["tp"], ".cp%d" % row["cp"] if row["cp"] > 1 else "",
                                  row["pp"], ".vpp%d" % row["vpp"] if row["vpp"] > 1 else "",
                                  row["dp"])


def rows(exe):
    """One row a published run: the pinned prediction, and per model the
    free search's best. Exits on a broken criterion."""
    tmp = tempfile.mkdtemp()
    out, bad = [], []
    for (name, layers, hidden, heads, gpus, batch, pp, v, mb, t_full, t_sel) in MODELS:
        path = os.path.join(tmp, "gpt-%s.yaml" % name)
        with open(path, "w") as f:
            f.write(model_yaml(name, layers, hidden, heads))
        pin = ["--tp", "8", "--pp", str(pp), "--vpp", str(v), "--zero", "0",
               "--micro-batch", str(mb)]
        free = fit(exe, path, gpus, batch, [])
        best = free["layouts"][0]
        for policy, sp, published in (("full", "--no-sp", t_full), ("selective", "--sp", t_sel)):
            r = fit(exe, path, gpus, batch, pin + ["--checkpoint", policy, sp])["layouts"][0]
            err = 100.0 * (r["step_s"] - published) / published
            if abs(err) > 15:
                bad.append("%s %s: %+.1f %% from the published %.2f s" % (name, policy, err,
                                                                          published))
            if best["step_s"] > r["step_s"]:
                bad.append("%s: the search's best %.4g s is slower than the published "
                           "layout's %.4g s" % (name, best["step_s"], r["step_s"]))
            out.append((name, gpus, batch, layout(r), mb, r["micro_batches"],
                        policy + (" + SP" if sp == "--sp" else ""), published, r["step_s"],
                        err, r["mfu"], layout(best), best["micro_batch"],
                        best["micro_batches"], best["checkpoint"], best["step_s"],
                        free["candidates"]))
        os.remove(path)
    os.rmdir(tmp)
    return out, bad


def table(exe):
    r, bad = rows(exe)
    lines = ["| model | GPUs | batch | published layout | micro x m | recomputation | "
             "published s | predicted s | error | MFU | searched best (micro x m, policy) | "
             "its step s | candidates |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (name, gpus, batch, lay, mb, m, policy, pub, pred, err, mfu, blay, bmb, bm, bpol,
         bs, cands) in r:
        lines.append("| %s | %d | %d | %s | %d x %d | %s | %.2f | %.4g | %+.1f %% | %.1f %% | "
                     "%s (%d x %d, %s) | %.4g | %d |"
                     % (name, gpus, batch, lay, mb, m, policy, pub, pred, err, 100 * mfu,
                        blay, bmb, bm, bpol, bs, cands))
    return "\n".join(lines), bad


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    text, bad = table(sys.argv[1])
    if len(sys.argv) == 4 and sys.argv[2] == "--check":
        for b in bad:
            print("FAIL " + b)
        doc = open(sys.argv[3], encoding="utf-8").read()
        if "%s\n%s\n%s" % (BEGIN, text, END) not in doc:
            print("FAIL %s does not hold the table this memledger makes:\n%s"
                  % (sys.argv[3], text))
            sys.exit(1)
        if bad:
            sys.exit(1)
        print("ok   %s: the published runs' table is what memledger plans today" % sys.argv[3])
        return
    print(text)
    for b in bad:
        print("FAIL " + b, file=sys.stderr)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
