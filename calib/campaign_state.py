#!/usr/bin/env python3
"""The allocator's state each run of the GPU campaign started from.

calib/torch_vs_plan.py measures every configuration in one process, one
after the other: each run ends with `del model, opt, ids` and
torch.cuda.empty_cache(), which releases every segment that holds no live
block. What the process allocates once and keeps outlives the first run
and pins the segments it sits in:

  - cuBLAS's workspaces: PyTorch keeps one per cuBLAS handle and stream,
    allocated through the caching allocator at the first matrix product and
    never freed (aten/src/ATen/cuda/CublasHandlePool.cpp,
    cublas_handle_stream_to_workspace; 4096 KiB x 8 = 32 MiB on Hopper, the
    default of CUBLAS_WORKSPACE_CONFIG there), and cuBLASLt's (1 MiB,
    getCUDABlasLtWorkspace). The first forward runs on the main thread's
    handle and the first backward on the autograd engine's device thread,
    whose handle is another: 32 + 1 MiB in the forward, 32 MiB in the
    backward.
  - a 4-byte tensor made before the model, once per process (later runs'
    traces do not make it again, and never allocate at its address).

So every run after the first started with those blocks allocated in the
segments they had landed in during the first run (trace 00: a 32 MiB
segment of its own, a 2 MiB small segment, and the 1,572 MiB segment the
first run's logits had made, with 32 MiB allocated 147 MiB into it), and
with those segments reserved: 1,606 MiB that max_memory_reserved counts.

This writes that state as a trace `memledger plan --allocator-start` reads:
the first run's own events (trace 00, converted), a free of everything
still live at its end except the blocks above, and an empty_cache. Replayed,
it leaves the simulator exactly as the first run left PyTorch's allocator.

    campaign_state.py TRACES.tar.gz [-o STATE.csv]

TRACES.tar.gz: traces.tar.gz or traces-expandable.tar.gz of a campaign
(calib/results/h200-2026-11-30). calib/alloc_validate.py replays the later
runs' traces from this state (docs/allocator.md, "Validation"): the
segments they made and their measured peaks come out to the byte, which is
what shows the blocks above are the ones that outlived the first run. No
torch needed.
"""
import argparse
import io
import os
import sys
import tarfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import snapshot_to_trace  # noqa: E402

MIB = 1 << 20
WORKSPACES = (32 * MIB, 1 * MIB)  # cuBLAS (Hopper's default) and cuBLASLt


def read_traces(tar_path):
    """(name, text) of each NN-model-attn-ckpt-precision.csv, by name."""
    with tarfile.open(tar_path) as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            if m.isfile() and m.name.endswith(".csv") and "/traces/" in "/" + m.name:
                yield os.path.basename(m.name), tar.extractfile(m).read().decode()


def live_at_end(text, name="trace 00"):
    """{address: (bytes, alloc index)} of the blocks live at the trace's end."""
    live, n = {}, 0
    for _, action, addr, size, _ in snapshot_to_trace.events_from_csv(text, name):
        if action == "alloc":
            live[addr] = (size, n)
            n += 1
        elif action == "free_completed":
            live.pop(addr, None)
    return live


def kept_blocks(live):
    """The first run's blocks that outlive it, of those live at its end: the
    first allocation (made before the model) and the workspaces' sizes."""
    return {a: v for a, v in live.items() if v[1] == 0 or v[0] in WORKSPACES}


def state_trace(text, name="trace 00"):
    """The trace that leaves the simulator as the first run left the
    allocator: its events, the frees of what del model, opt, ids released,
    and an empty_cache; and the kept blocks."""
    buf = io.StringIO()
    snapshot_to_trace.convert(snapshot_to_trace.events_from_csv(text, name), buf)
    live = live_at_end(text, name)
    kept = kept_blocks(live)
    out = [buf.getvalue().rstrip("\n")]
    out.append("# the end of the first run: del model, opt, ids; torch.cuda.empty_cache()")
    out += ["free,0x%x,%d" % (a, s) for a, (s, _) in live.items() if a not in kept]
    out.append("empty_cache")
    return "\n".join(out) + "\n", kept


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", help="the campaign's traces.tar.gz or traces-expandable.tar.gz")
    ap.add_argument("-o", "--output", help="the state trace (default: standard output)")
    a = ap.parse_args(argv)
    try:
        traces = list(read_traces(a.traces))
    except (OSError, tarfile.TarError) as e:
        print("campaign_state: error: %s: %s" % (a.traces, e), file=sys.stderr)
        return 2
    if not traces or not traces[0][0].startswith("00-"):
        print("campaign_state: error: %s: no trace of the first run (00-*.csv)" % a.traces,
              file=sys.stderr)
        return 2
    state, _ = state_trace(traces[0][1], traces[0][0])
    if a.output:
        with open(a.output, "w") as f:
            f.write(state)
    else:
        sys.stdout.write(state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
