#!/usr/bin/env python3
"""Converts PyTorch allocator events into the trace `memledger allocator` reads.

Input, either:
  - a pickle of torch.cuda.memory._snapshot() (recorded with
    torch.cuda.memory._record_memory_history()); the events are
    snapshot["device_traces"][DEVICE];
  - the CSV `action,addr,size,stream` that calib/torch_vs_plan.py --traces
    writes (the same events, one per line).

Output: the CSV `action,id,bytes` (docs/allocator.md). An `alloc` becomes
alloc,ID,BYTES with the requested size and ID the block's address in hex; a
`free_completed` (the block back in the cache) becomes free,ID,BYTES. A free
of an address the trace never allocated (a block from before the recording
started) is dropped and counted. `free_requested` (the same free, before
cross-stream events complete), `segment_*` (the allocator's own decisions:
what the simulation predicts), `oom`, `snapshot` and annotations are
skipped. The summary on stderr gives the real segment_alloc / segment_map
count and bytes, to compare with the simulation.

    snapshot_to_trace.py SNAPSHOT.pickle|EVENTS.csv [-o TRACE.csv] [--device N]

The pickle is read with an unpickler that accepts only plain containers,
strings and numbers (a snapshot holds nothing else), so a crafted file
cannot run code. Exit status 0, or 2 on bad input (message on stderr).
No torch needed.
"""
import argparse
import csv
import io
import pickle
import sys


class InputError(Exception):
    pass


class PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise InputError("the pickle names %s.%s: not a plain memory snapshot "
                         "(only dicts, lists, strings and numbers are read)" % (module, name))


def events_from_pickle(data, device):
    try:
        snap = PlainUnpickler(io.BytesIO(data)).load()
    except InputError:
        raise
    except Exception as e:
        raise InputError("not a readable pickle: %s" % e)
    if not isinstance(snap, dict) or "device_traces" not in snap:
        raise InputError("not a memory snapshot: no 'device_traces' key (record with "
                         "torch.cuda.memory._record_memory_history(), then pickle "
                         "torch.cuda.memory._snapshot())")
    traces = snap["device_traces"]
    if not isinstance(traces, list) or device >= len(traces):
        raise InputError("the snapshot has %d device trace(s); --device %d is not one of them"
                         % (len(traces) if isinstance(traces, list) else 0, device))
    for i, e in enumerate(traces[device]):
        try:
            yield "entry %d" % i, e["action"], int(e["addr"]), int(e["size"]), e.get("stream", 0)
        except (KeyError, TypeError, ValueError):
            raise InputError("device_traces[%d][%d]: an entry without action, addr and size"
                             % (device, i))


def events_from_csv(text, name):
    rows = csv.reader(io.StringIO(text))
    header = next(rows, None)
    if header != ["action", "addr", "size", "stream"]:
        raise InputError("%s:1: the header must be action,addr,size,stream" % name)
    for n, row in enumerate(rows, start=2):
        if not row:
            continue
        if len(row) != 4:
            raise InputError("%s:%d: expected 4 fields, got %d" % (name, n, len(row)))
        try:
            yield "%s:%d" % (name, n), row[0], int(row[1]), int(row[2]), row[3]
        except ValueError:
            raise InputError("%s:%d: addr and size must be whole numbers" % (name, n))


def convert(events, out):
    """Writes the trace to out; returns the summary counts."""
    live = {}  # address -> requested bytes
    s = {"rows": 0, "allocs": 0, "frees": 0, "dropped_frees": 0, "segment_alloc": 0,
         "segment_alloc_bytes": 0, "segment_map": 0, "segment_map_bytes": 0,
         "segment_free": 0, "segment_unmap": 0, "skipped": {}, "streams": set()}
    out.write("action,id,bytes\n")
    for where, action, addr, size, stream in events:
        s["rows"] += 1
        if action == "alloc":
            if addr in live:
                raise InputError("%s: alloc at 0x%x, which is allocated and not freed: the "
                                 "trace is inconsistent (more than one device, or a lost "
                                 "free)" % (where, addr))
            live[addr] = size
            s["allocs"] += 1
            s["streams"].add(stream)
            out.write("alloc,0x%x,%d\n" % (addr, size))
        elif action == "free_completed":
            if addr not in live:
                s["dropped_frees"] += 1
                continue
            out.write("free,0x%x,%d\n" % (addr, live.pop(addr)))
            s["frees"] += 1
        elif action in ("segment_alloc", "segment_map"):
            s[action] += 1
            s[action + "_bytes"] += size
        elif action in ("segment_free", "segment_unmap"):
            s[action] += 1
        else:
            s["skipped"][action] = s["skipped"].get(action, 0) + 1
    return s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("input", help="a pickled memory snapshot, or an action,addr,size,stream CSV")
    ap.add_argument("-o", "--output", help="the trace CSV (default: standard output)")
    ap.add_argument("--device", type=int, default=0, help="device_traces index (default 0)")
    a = ap.parse_args(argv)
    try:
        with open(a.input, "rb") as f:
            data = f.read()
    except OSError as e:
        print("snapshot_to_trace: error: %s: %s" % (a.input, e.strerror), file=sys.stderr)
        return 2
    buf = io.StringIO()
    try:
        if data.startswith(b"action,"):
            events = events_from_csv(data.decode("utf-8", "replace"), a.input)
        else:
            events = events_from_pickle(data, a.device)
        s = convert(events, buf)
    except InputError as e:
        print("snapshot_to_trace: error: %s" % e, file=sys.stderr)
        return 2
    if a.output:
        with open(a.output, "w") as f:
            f.write(buf.getvalue())
    else:
        sys.stdout.write(buf.getvalue())
    skipped = ", ".join("%s %d" % kv for kv in sorted(s["skipped"].items())) or "none"
    print("snapshot_to_trace: %d rows: %d allocs, %d frees; %d frees of blocks allocated "
          "before the recording dropped; real segment_alloc %d (%d B), segment_map %d (%d B), "
          "segment_free %d, segment_unmap %d; skipped: %s"
          % (s["rows"], s["allocs"], s["frees"], s["dropped_frees"], s["segment_alloc"],
             s["segment_alloc_bytes"], s["segment_map"], s["segment_map_bytes"],
             s["segment_free"], s["segment_unmap"], skipped), file=sys.stderr)
    if len(s["streams"]) > 1:
        print("snapshot_to_trace: warning: allocations on %d streams; the simulation has one"
              % len(s["streams"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
