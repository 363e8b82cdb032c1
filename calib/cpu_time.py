#!/usr/bin/python3
"""memledger's per-op step-time model (docs/time.md) against real PyTorch
training iterations on this CPU.

Usage: /usr/bin/python3 calib/cpu_time.py [MEMLEDGER] [--profile-out P.yaml]
                                          [--json-out R.json] [options]

What it does
------------
1. Memory bandwidth. Three STREAM-like kernels over 256 MiB fp32 tensors
   (64 Mi elements, far beyond any cache): `b.copy_(a)` (reads a, writes b:
   2 x 256 MiB), `torch.add(a, b, out=c)` (3 x 256 MiB) and `a.sum()` (a
   reduction: 1 x 256 MiB); each the median of --bw-runs runs after a
   warm-up, in GB/s (1e9 B/s). Measured on one thread, at torch's default
   thread count (torch.get_num_threads() as the process starts), and on
   os.cpu_count() threads when that differs; everything after runs at the
   default. The profile's `memory_gbps` is the best of the three kernels'
   medians at the default thread count (--bandwidth chooses another):
   memledger multiplies it by each kernel class's share (elementwise and
   copies 0.85, norms and softmax 0.70, dropout 0.60), so it plays the
   datasheet peak's part, which the best stream comes closest to.
2. A calibration profile. calib/profiles/cpu-fp32.yaml (--base), every key
   and comment kept, with `backend: "cpu"`, `memory_gbps:` (step 1) and a
   `host:` section: the `profile_host:` block that
   `calib/host_profile.py --quick` prints on this machine (the seven host
   dispatch costs). Written to --profile-out (default: a temporary file).
   The GEMM rates stay the profile's, which the C calibration runner
   (OpenBLAS) measured; torch's own products are timed too (512 and 1024
   cubed) and reported beside them, and a second profile with torch's
   rates in `gemm:` (<profile-out>.torch-gemm.yaml) gives a second planned
   column, so a GEMM-rate mismatch is told apart from the model's error.
3. Real training iterations of the repository's twin models
   (tests/torch/models/*.yaml, built by tests/torch/twins.py's `build` and
   `batch_for`, imported, not rewritten): forward (`model.run`, the loss
   included), `loss.backward()`, `opt.step()`,
   `opt.zero_grad(set_to_none=True)`; --warmup iterations, then --iters
   timed with time.perf_counter, the median. The optimizer is the YAML's
   (training.optimizer), at --optimizer-impl (foreach by default, as
   memledger plans unless told; torch 1.13's CPU default would be the
   for-loop). Checkpointed runs use torch.utils.checkpoint non-reentrant
   (twins.REENTRANT = False), which the planner models, and out-of-place
   ReLUs (twins.INPLACE = False), as the twins' checks do.
4. Each case planned: `MEMLEDGER plan MODEL.yaml --calib PROFILE
   --micro-batch B [--seq-len T] [--checkpoint full] --optimizer-impl I
   --allocator none --format json`, reading time.step_s, gpu_s, host_s,
   bound, source and serial.
5. A Markdown table (model, settings, measured, planned, error, bound), the
   median and worst |error|, the bandwidth and host figures used and every
   command; --json-out writes the raw results.
6. Where the time goes (unless --no-breakdown): --breakdown-iters more
   iterations under torch.profiler, after the timed ones, split by self
   CPU time into products (mm, addmm, bmm, convolutions), the other aten
   ops and the rest of the wall time (Python, autograd's nodes, the
   optimizer's Python), beside the plan's time.gemm_s, time.memory_s and
   time.host_s. The split is rough: a tiny op's self time is mostly its
   dispatch, and the profiler slows the host.

If memledger refuses the profile (an older build without `memory_gbps`),
the measured side is printed all the same, with memledger's message.

Limits
------
- One processor does everything: on a CPU the host's dispatch (Python, the
  modules, the dispatcher, autograd) and the kernels run on the same
  cores, one after the other; memledger times a `backend: "cpu"` profile
  serially (JSON time.serial). Its "gpu_s" is then the kernels' time.
- torch 1.13 (Debian's CPU build): no scaled_dot_product_attention (the
  twins' eager attention runs as written), a for-loop optimizer by
  default (foreach is asked for explicitly here), OpenMP thread pools.
- The models are memledger's twins (tiny GPT-2, Llama, CNN, MLP
  layouts written in plain torch.nn), not Hugging Face's modules: their
  Python per block is smaller than transformers' is.
- At these sizes much of every tensor sits in cache, where the kernels
  beat the DRAM bandwidth measured in step 1; the larger cases are there
  to put weight on the kernels' side.
- The torch-GEMM variant takes memledger's per-product latency t0 from
  torch's square products (the median of what each took beyond the best
  rate): a slow 256-cubed product makes t0 large, which every small
  product of the twins then pays; it is a diagnostic, not a fit.
- A shared VM's noise: the medians of 5 iterations move by a few per cent
  between runs.
- Each case is timed in this process, one after another; the host
  profile runs in a child process (its figures are its own process's).
"""
import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TWINS_DIR = os.path.join(ROOT, "tests", "torch")
MODELS_DIR = os.path.join(TWINS_DIR, "models")
HOST_KEYS = ("forward_op_us", "backward_op_us", "forward_block_us", "backward_block_us",
             "recompute_block_us", "step_call_us", "step_tensor_us")

# (label, model file, micro-batch, seq_len or None, checkpoint full)
# The YAML's own sizes first (the twins' checks run these), then larger
# ones, so both the host-bound and the kernel-bound end are held.
CASES = [
    ("mlp", "mlp.yaml", 4096, None, False),
    ("mlp", "mlp.yaml", 16384, None, False),
    ("resnet", "resnet.yaml", 4, None, False),
    ("resnet", "resnet.yaml", 64, None, False),
    ("resnet", "resnet.yaml", 64, None, True),
    ("gpt2", "gpt2.yaml", 2, 32, False),
    ("gpt2-nodrop", "gpt2-nodrop.yaml", 8, 64, False),
    ("gpt2-nodrop", "gpt2-nodrop.yaml", 8, 64, True),
    ("llama", "llama.yaml", 2, 24, False),
    ("llama", "llama.yaml", 8, 128, False),
    ("llama", "llama.yaml", 8, 128, True),
    ("vit", "vit.yaml", 32, None, False),
]


# --------------------------------------------------------------------------
# 1. Memory bandwidth

def bandwidth(torch, threads, mib, runs):
    """GB/s of copy_, add and sum over `mib` MiB fp32 tensors on `threads`
    threads: {kernel: {"gbps": median, "runs": [...]}}."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = mib * 2 ** 20 // 4
        a = torch.empty(n, dtype=torch.float32).fill_(1.0)
        b = torch.empty(n, dtype=torch.float32).fill_(2.0)
        c = torch.empty(n, dtype=torch.float32).fill_(0.0)
        kernels = {
            "copy": (lambda: b.copy_(a), 2 * n * 4),
            "add": (lambda: torch.add(a, b, out=c), 3 * n * 4),
            "sum": (lambda: a.sum(), n * 4),
        }
        out = {}
        for name, (fn, nbytes) in kernels.items():
            fn()  # warm-up
            gbps = []
            for _ in range(runs):
                t0 = time.perf_counter()
                fn()
                gbps.append(nbytes / (time.perf_counter() - t0) / 1e9)
            out[name] = {"gbps": statistics.median(gbps), "bytes": nbytes,
                         "runs": [round(g, 3) for g in gbps]}
        return out  # the tensors go with this frame
    finally:
        torch.set_num_threads(old)


def torch_gemm(torch, sizes=(256, 512, 1024), runs=5):
    """torch's fp32 square products at the current thread count:
    [{m, n, k, tflops}] (the median of `runs` after a warm-up)."""
    out = []
    for s in sizes:
        a, b = torch.randn(s, s), torch.randn(s, s)
        c = a @ b
        ts = []
        for _ in range(runs):
            t0 = time.perf_counter()
            c = torch.mm(a, b, out=c)
            ts.append(time.perf_counter() - t0)
        out.append({"m": s, "n": s, "k": s, "tflops": 2.0 * s ** 3 / statistics.median(ts) / 1e12})
    return out


# --------------------------------------------------------------------------
# 2. The profile

def host_section(python, quick=True):
    """calib/host_profile.py's profile_host: block (and its full output)."""
    import yaml
    cmd = [python, os.path.join(HERE, "host_profile.py")] + (["--quick"] if quick else [])
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit("cpu_time: %s failed (%d):\n%s" % (" ".join(cmd), r.returncode, r.stderr))
    doc = yaml.safe_load(r.stdout)
    host = (doc or {}).get("profile_host")
    if not isinstance(host, dict) or any(k not in host for k in HOST_KEYS):
        raise SystemExit("cpu_time: %s printed no profile_host: block with %s"
                         % (" ".join(cmd), ", ".join(HOST_KEYS)))
    return {k: float(host[k]) for k in HOST_KEYS}, cmd, doc.get("host", {})


TOP = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*:")


def drop_top_keys(lines, keys):
    """The profile's lines without the top-level entries `keys` (a key's
    line and its indented or blank continuation)."""
    out, skipping = [], False
    for ln in lines:
        m = TOP.match(ln)
        if m:
            skipping = m.group(1) in keys
        elif skipping and (ln.startswith((" ", "\t", "-")) or not ln.strip()):
            continue
        elif not ln.startswith((" ", "\t")) and ln.strip():
            skipping = False  # a top-level comment ends the entry
        if not skipping:
            out.append(ln)
    return out


def yaml_str(s):
    return json.dumps(s)  # a double-quoted YAML scalar


def make_profile(base_text, gbps, host, gemm=None, note=None):
    """The base profile with backend "cpu", memory_gbps and host: set
    (replaced where present), every other key and comment kept; gemm: a
    [{m, n, k, tflops}] list replacing the profile's GEMMs (and
    achieved_tflops, their best), for the torch-GEMM variant."""
    drop = {"backend", "memory_gbps", "host"}
    if gemm:
        drop |= {"gemm", "achieved_tflops"}
    lines = drop_top_keys(base_text.splitlines(), drop)
    # backend where the base had it (after name), else first
    at = next((i + 1 for i, ln in enumerate(lines) if TOP.match(ln) and TOP.match(ln).group(1) == "name"), 0)
    lines.insert(at, 'backend: "cpu"')
    tail = []
    if note:
        tail.append("# " + note)
    tail.append("memory_gbps: %.6g" % gbps)
    if gemm:
        tail.append("achieved_tflops: %.17g" % max(g["tflops"] for g in gemm))
        tail.append("gemm:")
        for g in gemm:
            tail.append("  - {m: %d, n: %d, k: %d, tflops: %.17g}" % (g["m"], g["n"], g["k"], g["tflops"]))
    tail.append("host:")
    for k in HOST_KEYS:
        tail.append("  %s: %.6g" % (k, host[k]))
    # the base's layers: list runs to the end of the file; top-level keys
    # may follow it
    return "\n".join(lines).rstrip("\n") + "\n" + "\n".join(tail) + "\n"


# --------------------------------------------------------------------------
# 3. The twins' training iterations

def optimizer_for(torch, doc, params, impl):
    name = doc.get("training", {}).get("optimizer", "adamw")
    fe = impl == "foreach"
    if name in ("adam", "adamw"):
        cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        return name, cls(params, foreach=fe)
    if name == "sgd-momentum":
        return name, torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=fe)
    if name == "sgd":
        return name, torch.optim.SGD(params, lr=0.1, foreach=fe)
    raise SystemExit("cpu_time: optimizer %s not built here" % name)


PRODUCT = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|addbmm|addmv|mv|dot|_?mkldnn_convolution.*|"
                     r"convolution_backward|_?slow_conv.*|thnn_conv.*|_nnpack.*)$")


def breakdown(torch, step, iters):
    """Where an iteration's time goes, by torch.profiler's self CPU time
    (a separate pass: the profiler slows the host): products (mm, bmm,
    addmm, convolutions), the other aten ops, and the rest of the wall
    time (Python, autograd's nodes, the optimizer's Python), each per
    iteration in seconds; the other ops' top three."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        wall = time.perf_counter() - t0
    prod = other = 0.0
    tops = {}
    for e in prof.key_averages():
        us = e.self_cpu_time_total
        if PRODUCT.match(e.key):
            prod += us
        elif e.key.startswith("aten::"):
            other += us
            tops[e.key[6:]] = tops.get(e.key[6:], 0.0) + us
    n = float(iters)
    top = sorted(tops.items(), key=lambda kv: -kv[1])[:3]
    return {"wall_s": wall / n, "products_s": prod / 1e6 / n, "other_ops_s": other / 1e6 / n,
            "rest_s": max(0.0, wall / n - (prod + other) / 1e6 / n),
            "top_other": [[k, v / 1e6 / n] for k, v in top]}


def time_twin(torch, tw, path, B, T, ckpt, impl, warmup, iters, bd_iters=0):
    """Median seconds of one training iteration of the twin at `path`
    (and every iteration's time; with bd_iters, a profiled breakdown)."""
    with open(path) as fh:
        doc = tw.load(fh)
    torch.manual_seed(0)
    tw.INPLACE[0] = not ckpt
    tw.REENTRANT[0] = False  # the planner's non-reentrant checkpoint
    tw.CKPT_EVERY[0] = 1
    tw.FUSED[0] = False
    tw.BWD_MARK[0] = None
    model = tw.build(doc)
    model.train()
    batch = tw.batch_for(doc, model, B, T or 1)
    optim, opt = optimizer_for(torch, doc, model.parameters(), impl)
    rec = types.SimpleNamespace(block="?", pinned={})

    def step():
        rec.pinned.clear()
        loss = model.run(rec, batch, ckpt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(warmup):
        step()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t0)
    params = sum(p.numel() for p in model.parameters())
    bd = breakdown(torch, step, bd_iters) if bd_iters > 0 else None
    return statistics.median(ts), ts, optim, params, doc, bd


# --------------------------------------------------------------------------
# 4. The plans

def plan_cmd(memledger, path, B, T, ckpt, impl, profile):
    cmd = [memledger, "plan", path, "--calib", profile, "--micro-batch", str(B)]
    if T:
        cmd += ["--seq-len", str(T)]
    if ckpt:
        cmd += ["--checkpoint", "full"]
    cmd += ["--optimizer-impl", impl, "--allocator", "none", "--format", "json"]
    return cmd


def plan(cmd):
    """time.* of the plan, or {"error": memledger's message}."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    except OSError as e:
        return {"error": str(e)}
    if r.returncode not in (0, 1):
        return {"error": (r.stderr.strip() or r.stdout.strip() or "exit %d" % r.returncode)}
    try:
        j = json.loads(r.stdout)
    except ValueError as e:
        return {"error": "unreadable JSON: %s" % e}
    t = j.get("time") or {}
    out = {k: t.get(k) for k in ("step_s", "gpu_s", "host_s", "bound", "source", "serial",
                                 "gemm_s", "memory_s", "by_phase", "kernels", "recomputed_blocks")}
    out["step_time_s"] = j.get("step_time_s")
    if out["step_s"] is None:
        out["error"] = "time.step_s is null (time.source %s): the profile's memory_gbps was not used" \
            % t.get("source")
    return out


# --------------------------------------------------------------------------
# 5. The report

def fmt_s(x):
    return "—" if x is None else ("%.4g" % x)


def err_pct(planned, measured):
    if planned is None or not measured:
        return None
    return (planned - measured) / measured * 100.0


def summary(errs):
    a = [abs(e) for e in errs if e is not None]
    if not a:
        return None, None
    return statistics.median(a), max(a)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("memledger", nargs="?", default=os.path.join(ROOT, "build", "src", "memledger"),
                    help="the memledger binary (default: build/src/memledger)")
    ap.add_argument("--base", default=os.path.join(HERE, "profiles", "cpu-fp32.yaml"),
                    help="the profile to start from (default: calib/profiles/cpu-fp32.yaml)")
    ap.add_argument("--profile-out", help="where to write the profile (default: a temporary file)")
    ap.add_argument("--json-out", help="write the raw results as JSON here")
    ap.add_argument("--bw-mib", type=int, default=256, help="tensor size for the bandwidth, MiB (256)")
    ap.add_argument("--bw-runs", type=int, default=10, help="runs per bandwidth kernel (10)")
    ap.add_argument("--bandwidth", choices=("best", "copy", "add", "sum"), default="best",
                    help="which kernel's median becomes memory_gbps (default: the best)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up iterations per case (2)")
    ap.add_argument("--iters", type=int, default=5, help="timed iterations per case (5)")
    ap.add_argument("--optimizer-impl", choices=("foreach", "for-loop"), default="foreach",
                    help="the optimizer's implementation, in torch and in the plan (foreach)")
    ap.add_argument("--only", action="append", default=[],
                    help="run only the cases whose label contains this (repeatable)")
    ap.add_argument("--no-torch-gemm", action="store_true",
                    help="skip the second plan with torch's measured GEMM rates")
    ap.add_argument("--no-breakdown", action="store_true",
                    help="skip the profiled pass that splits each iteration (products, other ops, the rest)")
    ap.add_argument("--breakdown-iters", type=int, default=2,
                    help="iterations of the profiled pass (2)")
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter for calib/host_profile.py (default: this one)")
    args = ap.parse_args()
    if os.sep in args.memledger:  # a path, not a name on PATH: the plans run from the root
        args.memledger = os.path.abspath(args.memledger)

    t_start = time.perf_counter()
    import torch
    import yaml  # noqa: F401  (host_section parses with it; fail early)
    sys.path.insert(0, TWINS_DIR)
    import twins as tw

    default_threads = torch.get_num_threads()
    ncpu = os.cpu_count() or 1
    res = {"torch": torch.__version__, "python": sys.version.split()[0], "threads_default": default_threads,
           "cpu_count": ncpu, "memledger": args.memledger, "optimizer_impl": args.optimizer_impl}
    try:
        with open("/proc/cpuinfo") as fh:
            res["cpu"] = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "?")
    except OSError:
        res["cpu"] = "?"

    # 1. bandwidth
    bw = {}
    for th in sorted({1, default_threads, ncpu}):
        bw[th] = bandwidth(torch, th, args.bw_mib, args.bw_runs)
    res["bandwidth"] = {str(k): v for k, v in bw.items()}
    at_default = bw[default_threads]
    if args.bandwidth == "best":
        pick = max(at_default, key=lambda k: at_default[k]["gbps"])
    else:
        pick = args.bandwidth
    gbps = at_default[pick]["gbps"]
    res["memory_gbps"] = gbps
    res["memory_gbps_from"] = "%s at %d thread(s)" % (pick, default_threads)
    gemm_t = torch_gemm(torch)
    res["torch_gemm"] = gemm_t

    # 2. profile
    host, host_cmd, host_full = host_section(args.python)
    res["host"] = host
    res["host_command"] = " ".join(shlex.quote(c) for c in host_cmd)
    res["host_profile_threads"] = host_full.get("threads") if isinstance(host_full, dict) else None
    with open(args.base) as fh:
        base = fh.read()
    note = ("calib/cpu_time.py: memory_gbps the best of copy/add/sum over %d MiB fp32 at %d thread(s); "
            "host: calib/host_profile.py --quick" % (args.bw_mib, default_threads))
    prof_text = make_profile(base, gbps, host, note=note)
    if args.profile_out:
        profile = os.path.abspath(args.profile_out)
    else:
        fd, profile = tempfile.mkstemp(prefix="memledger-cpu-", suffix=".yaml")
        os.close(fd)
    with open(profile, "w") as fh:
        fh.write(prof_text)
    res["profile"] = profile
    # the written profile parses, and kept every key of the base
    import yaml as _y
    keys_base = set((_y.safe_load(base) or {}).keys())
    keys_new = set((_y.safe_load(prof_text) or {}).keys())
    missing = keys_base - keys_new
    if missing:
        raise SystemExit("cpu_time: the profile lost keys %s" % sorted(missing))
    base_gemm = (_y.safe_load(base) or {}).get("gemm") or []
    res["profile_gemm"] = base_gemm
    profile_t = None
    if not args.no_torch_gemm:
        profile_t = re.sub(r"\.ya?ml$", "", profile) + ".torch-gemm.yaml"
        with open(profile_t, "w") as fh:
            fh.write(make_profile(base, gbps, host, gemm=gemm_t,
                                  note=note + "; gemm: torch.mm at %d thread(s)" % default_threads))
        res["profile_torch_gemm"] = profile_t

    # 3 and 4. the cases
    cases = [c for c in CASES if not args.only or any(o in c[0] for o in args.only)]
    rows = []
    for label, fname, B, T, ckpt in cases:
        path = os.path.join(MODELS_DIR, fname)
        row = {"model": label, "file": os.path.relpath(path, ROOT), "micro_batch": B, "seq_len": T,
               "checkpoint": "full" if ckpt else "none"}
        try:
            med, ts, optim, params, doc, bd = time_twin(torch, tw, path, B, T, ckpt, args.optimizer_impl,
                                                        args.warmup, args.iters,
                                                        0 if args.no_breakdown else args.breakdown_iters)
            row.update(measured_s=med, iters_s=[round(t, 6) for t in ts], optimizer=optim, params=params,
                       name=doc.get("name"))
            if bd:
                row["breakdown"] = bd
        except Exception as e:  # a twin that does not run: said, and the rest go on
            row.update(measured_s=None, measure_error="%s: %s" % (type(e).__name__, e))
        cmd = plan_cmd(args.memledger, row["file"], B, T, ckpt, args.optimizer_impl, profile)
        row["command"] = " ".join(shlex.quote(c) for c in cmd)
        row["plan"] = plan(cmd)
        row["error_pct"] = err_pct(row["plan"].get("step_s"), row.get("measured_s"))
        if profile_t:
            cmd_t = plan_cmd(args.memledger, row["file"], B, T, ckpt, args.optimizer_impl, profile_t)
            row["plan_torch_gemm"] = plan(cmd_t)
            row["error_pct_torch_gemm"] = err_pct(row["plan_torch_gemm"].get("step_s"), row.get("measured_s"))
        rows.append(row)
        print("  %-12s B=%-5d%s%s measured %s s, planned %s s" % (
            label, B, " T=%-4d" % T if T else "", " ckpt" if ckpt else "",
            fmt_s(row.get("measured_s")), fmt_s(row["plan"].get("step_s"))), file=sys.stderr)
    res["cases"] = rows
    res["seconds"] = time.perf_counter() - t_start

    # 5. report
    P = print
    P("# memledger step time against PyTorch on this CPU\n")
    P("%s, %d CPU(s); torch %s, Python %s; torch threads %d (default); optimizer %s; fp32.\n"
      % (res["cpu"], ncpu, res["torch"], res["python"], default_threads, args.optimizer_impl))
    P("## Memory bandwidth (GB/s = 1e9 B/s; median of %d runs, %d MiB fp32 tensors)\n"
      % (args.bw_runs, args.bw_mib))
    P("| threads | copy_ (2 passes) | add (3 passes) | sum (1 pass) |")
    P("|---|---|---|---|")
    for th, k in bw.items():
        tag = " (default)" if th == default_threads else ""
        P("| %d%s | %.2f | %.2f | %.2f |" % (th, tag, k["copy"]["gbps"], k["add"]["gbps"], k["sum"]["gbps"]))
    P("\nmemory_gbps: %.4g (%s)\n" % (gbps, res["memory_gbps_from"]))
    P("GEMM rates (TFLOP/s): profile %s; torch.mm here %s\n" % (
        ", ".join("%d³ %.3f" % (g["m"], g["tflops"]) for g in base_gemm) or "none",
        ", ".join("%d³ %.3f" % (g["m"], g["tflops"]) for g in gemm_t)))
    P("## Host costs (µs; `%s`, profile_host: pasted as host:)\n" % res["host_command"])
    P("| " + " | ".join(HOST_KEYS) + " |")
    P("|" + "---|" * len(HOST_KEYS))
    P("| " + " | ".join("%.4g" % host[k] for k in HOST_KEYS) + " |")
    P("\nProfile: %s%s\n" % (profile, "; torch-GEMM variant: %s" % profile_t if profile_t else ""))
    P("## Step time: %d warm-up, median of %d iterations\n" % (args.warmup, args.iters))
    hdr = "| model | settings | measured s | planned s | error % | bound | GPU (kernels) s | host s |"
    sep = "|---|---|---|---|---|---|---|---|"
    if profile_t:
        hdr += " planned s, torch GEMMs | error % |"
        sep += "---|---|"
    P(hdr)
    P(sep)
    for r in rows:
        pl = r["plan"]
        sett = "B=%d%s%s, %s" % (r["micro_batch"], " T=%d" % r["seq_len"] if r["seq_len"] else "",
                                 ", ckpt full" if r["checkpoint"] == "full" else "", r.get("optimizer", "?"))
        e = r["error_pct"]
        line = "| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["model"], sett, fmt_s(r.get("measured_s")), fmt_s(pl.get("step_s")),
            "—" if e is None else "%+.1f" % e, pl.get("bound") or "—", fmt_s(pl.get("gpu_s")),
            fmt_s(pl.get("host_s")))
        if profile_t:
            pt = r["plan_torch_gemm"]
            et = r["error_pct_torch_gemm"]
            line += " %s | %s |" % (fmt_s(pt.get("step_s")), "—" if et is None else "%+.1f" % et)
        P(line)
    med, worst = summary([r["error_pct"] for r in rows])
    if any(r["plan"].get("serial") for r in rows):
        P("\nserial (backend cpu): step = host + kernels on one processor; bound \"gpu\" means the "
          "kernels' share is the larger. error = (planned − measured) / measured.")
    P("")
    if med is None:
        P("No plan was timed.")
    else:
        P("|error|: median %.1f %%, worst %.1f %% (%d cases)" % (
            med, worst, sum(r["error_pct"] is not None for r in rows)))
    if profile_t:
        mt, wt = summary([r["error_pct_torch_gemm"] for r in rows])
        if mt is not None:
            P("|error| with torch's GEMM rates: median %.1f %%, worst %.1f %%" % (mt, wt))
    res["median_abs_error_pct"], res["worst_abs_error_pct"] = med, worst
    if any(r.get("breakdown") for r in rows):
        P("\n## Where the time goes (torch.profiler self CPU time per iteration, a separate pass; "
          "ms)\n")
        P("Measured: products (mm, addmm, bmm, convolutions), the other aten ops, the rest "
          "(Python, autograd's nodes, the optimizer's Python: wall less both; the profiler "
          "adds to it). Planned: time.gemm_s, time.memory_s, time.host_s.\n")
        P("| model | settings | profiled wall | products | planned products | other ops | "
          "planned memory-bound | rest | planned host | top other ops |")
        P("|---|---|---|---|---|---|---|---|---|---|")
        ms = lambda x: "—" if x is None else "%.3g" % (x * 1e3)  # noqa: E731
        for r in rows:
            bd, pl = r.get("breakdown"), r["plan"]
            if not bd:
                continue
            sett = "B=%d%s%s" % (r["micro_batch"], " T=%d" % r["seq_len"] if r["seq_len"] else "",
                                 ", ckpt" if r["checkpoint"] == "full" else "")
            P("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r["model"], sett, ms(bd["wall_s"]), ms(bd["products_s"]), ms(pl.get("gemm_s")),
                ms(bd["other_ops_s"]), ms(pl.get("memory_s")), ms(bd["rest_s"]), ms(pl.get("host_s")),
                ", ".join("%s %s" % (k, ms(v)) for k, v in bd["top_other"])))
    errs = {}
    for r in rows:
        for key in ("plan", "plan_torch_gemm"):
            if r.get(key, {}).get("error"):
                errs.setdefault(r[key]["error"], []).append(r["model"])
        if r.get("measure_error"):
            P("\nmeasurement failed, %s: %s" % (r["model"], r["measure_error"]))
    for msg, who in errs.items():
        P("\nmemledger did not time %s:\n    %s" % (", ".join(sorted(set(who))), msg))
    P("\n## Commands (memledger's from the repository root, %s)\n" % ROOT)
    P("    %s" % res["host_command"])
    for r in rows:
        P("    %s" % r["command"])
    P("\n(%.1f s in all)" % res["seconds"])

    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(res, fh, indent=1)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
