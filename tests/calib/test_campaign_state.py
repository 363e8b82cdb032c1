#!/usr/bin/env python3
"""calib/campaign_state.py against the real allocator (no GPU): the state it
derives from the H200 campaign's first trace must leave `memledger
allocator` where the first run left PyTorch's allocator, so that the later
traced runs replayed from it make the segments their own traces record
(segment_alloc rows) and reach the max_memory_reserved results.jsonl
measured, to the byte (docs/allocator.md, "Validation"). The kept blocks are
the four the docs name: the 4-byte tensor and cuBLAS's and cuBLASLt's
workspaces (32 + 1 MiB in the forward, 32 MiB in the backward).

Usage: test_campaign_state.py CAMPAIGN_STATE_PY RESULTS_DIR MEMLEDGER"""
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile

MIB = 1 << 20


def main():
    script, results, ml = sys.argv[1:4]
    spec = importlib.util.spec_from_file_location("campaign_state", script)
    cs = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(script))
    spec.loader.exec_module(cs)
    import snapshot_to_trace
    traces = list(cs.read_traces(os.path.join(results, "traces.tar.gz")))
    state, kept = cs.state_trace(traces[0][1], traces[0][0])
    sizes = sorted(s for s, _ in kept.values())
    bad = []
    if sizes != [4, 1 * MIB, 32 * MIB, 32 * MIB]:
        bad.append("kept blocks %s, expected 4 B, 1 MiB and two of 32 MiB" % sizes)
    measured = {}
    with open(os.path.join(results, "results.jsonl")) as f:
        runs = [json.loads(l) for l in f][1:]
    with tempfile.TemporaryDirectory() as tmp:
        start = os.path.join(tmp, "start.csv")
        with open(start, "w") as f:
            f.write(state)
        for name, text in traces[1:]:
            index = int(name[:2])
            m = runs[index]["measured"]
            want_reserved = max(m[p]["reserved"] for p in ("first", "steady", "eval"))
            want_segments = sum(1 for l in text.splitlines() if l.startswith("segment_alloc,"))
            conv = os.path.join(tmp, "trace.csv")
            with open(conv, "w") as f:
                snapshot_to_trace.convert(snapshot_to_trace.events_from_csv(text, name), f)
            out = subprocess.run([ml, "allocator", conv, "--allocator-start", start,
                                  "--format", "json"], capture_output=True, text=True)
            if out.returncode:
                sys.exit("memledger allocator failed: %s" % out.stderr)
            got = json.loads(out.stdout)
            print("%s: %d segments made (real %d), reserved %d B (measured %d B)" % (
                name, got["device_allocs"], want_segments, got["reserved_peak"], want_reserved))
            if got["device_allocs"] != want_segments or got["reserved_peak"] != want_reserved:
                bad.append(name)
    if len(traces) < 3:
        bad.append("expected the first run's trace and two later ones")
    if bad:
        sys.exit("not as the real allocator: %s" % ", ".join(bad))


if __name__ == "__main__":
    main()
