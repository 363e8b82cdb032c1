#!/usr/bin/env python3
"""The allocator simulation against the real allocator on an H200.

For each trace of the GPU campaign (calib/results/h200-2026-11-30/
traces.tar.gz, replayed with the default caching allocator, and
traces-expandable.tar.gz, with expandable segments), this

  - derives the real figures from the original events: the segment_alloc
    (or segment_map) rows' count and bytes, and how many allocations landed
    in memory the trace never saw reserved (a cache that was not empty when
    the recording began);
  - converts the events with snapshot_to_trace.py and replays them with
    `memledger allocator` (the whole trace, and the prefix through the first
    iteration, cut at the trace's alloc_count_marks); a trace other than the
    first run's (00-*) from the cache the first run left in the process
    (--allocator-start, the state calib/campaign_state.py writes);
  - reads the measured max_memory_reserved / max_memory_allocated of the same
    run from results.jsonl / results-expandable.jsonl (matched by the
    configuration index, the NN of NN-model-attn-ckpt-precision.csv),

and prints one markdown table (docs/allocator.md, "Validation").

    calib/alloc_validate.py MEMLEDGER_EXE [RESULTS_DIR]
"""
import io
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import campaign_state  # noqa: E402
import snapshot_to_trace  # noqa: E402

GIB = float(1 << 30)


def real_figures(text):
    """From the original events: segments, their bytes, and the allocations
    outside every segment this trace reserved."""
    segs, count, total, outside = [], 0, 0, 0
    for line in text.splitlines()[1:]:
        action, addr, size, _ = line.split(",")
        addr, size = int(addr), int(size)
        if action in ("segment_alloc", "segment_map"):
            segs.append((addr, addr + size))
            count += 1
            total += size
        elif action == "alloc" and not any(a <= addr < b for a, b in segs):
            outside += 1
    return count, total, outside


def measured(results_path, name):
    """The measured record of the run a trace NN-model-attn-ckpt-precision.csv
    comes from: the same configuration (and index, where the file has one)."""
    parts = name[:-4].split("-")
    index, attn, ckpt, prec = int(parts[0]), parts[-3], parts[-2], parts[-1]
    model = "-".join(parts[1:-3])
    with open(results_path) as f:
        for line in f:
            r = json.loads(line)
            if (r.get("model") == model and r.get("attn") == attn and
                    r.get("ckpt") == (ckpt == "full") and r.get("amp") == (prec == "bf16") and
                    r.get("index", index) == index and isinstance(r.get("measured"), dict) and
                    "trace" in r["measured"]):
                return r["measured"]
    raise SystemExit("%s: no measured run of that configuration in %s" % (name, results_path))


def replay(exe, trace_text, mode, tmp, start=None):
    path = os.path.join(tmp, "trace.csv")
    with open(path, "w") as f:
        f.write(trace_text)
    args = [exe, "allocator", path, "--allocator", mode, "--format", "json"]
    if start:
        args += ["--allocator-start", start]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("memledger allocator failed: %s" % r.stderr)
    return json.loads(r.stdout)


def prefix(trace_text, allocs):
    """The trace up to (not including) alloc number allocs + 1."""
    out, n = [], 0
    for line in trace_text.splitlines():
        if line.startswith("alloc,"):
            n += 1
            if n > allocs:
                break
        out.append(line)
    return "\n".join(out) + "\n"


def main():
    exe = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    res = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "results", "h200-2026-11-30")
    print("| trace | allocator | segments made: real / simulated | reserved: real segments / "
          "simulated / measured | allocated: simulated / measured | first iteration reserved: "
          "simulated / measured | allocs outside the trace's segments |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for tar, results, mode in (("traces.tar.gz", "results.jsonl", "caching"),
                                   ("traces-expandable.tar.gz", "results-expandable.jsonl",
                                    "expandable")):
            start = None
            for name, text in campaign_state.read_traces(os.path.join(res, tar)):
                count, total, outside = real_figures(text)
                buf = io.StringIO()
                snapshot_to_trace.convert(snapshot_to_trace.events_from_csv(text, name), buf)
                conv = buf.getvalue()
                if name.startswith("00-"):
                    # the first run: the later ones start from what it leaves
                    start = os.path.join(tmp, "start-%s.csv" % mode)
                    with open(start, "w") as f:
                        f.write(campaign_state.state_trace(text, name)[0])
                    run_start = None
                else:
                    run_start = start
                sim = replay(exe, conv, mode, tmp, run_start)
                m = measured(os.path.join(res, results), name)
                peak_res = max(m[p]["reserved"] for p in ("first", "steady", "eval"))
                peak_all = max(m[p]["allocated"] for p in ("first", "steady", "eval"))
                marks = m["trace"]["alloc_count_marks"]
                first = replay(exe, prefix(conv, marks["steady"] - marks["start"]), mode, tmp,
                               run_start)
                sim_segs = sim["device_allocs"]
                print("| %s | %s | %d / %d | %.3f / %.3f / %.3f GiB | %.3f / %.3f GiB | "
                      "%.3f / %.3f GiB | %d |" % (
                          name[:-4], mode, count, sim_segs, total / GIB,
                          sim["reserved_peak"] / GIB, peak_res / GIB,
                          sim["allocated_peak"] / GIB, peak_all / GIB,
                          first["reserved_peak"] / GIB, m["first"]["reserved"] / GIB, outside))
                print("  %s %s: bytes real segments %d, simulated reserved %d, measured %d; "
                      "allocated simulated %d, measured %d" % (
                          name, mode, total, sim["reserved_peak"], peak_res,
                          sim["allocated_peak"], peak_all), file=sys.stderr)


if __name__ == "__main__":
    main()
