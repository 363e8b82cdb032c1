#!/usr/bin/python3
"""The fused head's norm on a 2-byte stream against real PyTorch
(docs/graph.md, "The fused head's norm on a 2-byte stream").

With `logits: fused` the head block is the final norm alone, and its
backward is replayed node by node in every dtype but autocast's. For
Llama's and Gemma's RMSNorm on a bf16 or fp16 stream the norm upcasts its
input (x.to(float32)), so the gradients of its middle (x * rsqrt, rsqrt,
mean, pow) are fp32 and are cast back at each end. This oracle runs the
torch twins of tests/torch/models/llama.yaml and gemma.yaml with their
weights in bf16 and fp16 (not autocast: the planner's `bf16` precision,
and fp16 likewise) and Liger's fused linear cross-entropy (twins.py,
FusedLinearCE), under the live-bytes oracle's profiler (livebytes.py),
and compares the head's backward: from the moment the norm's output
gradient exists (bwd:head) to the moment its input's does (the last
layer's bwd mark), the highest live bytes above the level at its start,
against the plan's timeline (the backward rows of step `head`, above the
total before them). The same for the head's forward as a control.

usage: fusednorm.py MEMLEDGER MODELS_DIR
Prints the checks; ends with "N passed, N failed".
"""
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import crosscheck as xc  # noqa: E402
import livebytes as lb  # noqa: E402
import twins as tw  # noqa: E402

# fp16: 1.13 has no CPU half matmul (addmm_impl_cpu_); fp16-master
# plans the same norm nodes in 2-byte gradients as bf16-master
PRECISIONS = {"bf16": torch.bfloat16, "bf16-master": torch.bfloat16}


def planned_head_bwd(memledger, path, prec, B, T):
    """The timeline's head backward: its highest total above the total
    before its first row."""
    out = subprocess.run([memledger, "timeline", path, "--format", "csv", "--precision", prec,
                          "--logits", "fused", "--optimizer", "sgd", "--micro-batch", str(B),
                          "--seq-len", str(T)], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("memledger timeline failed: %s" % out.stderr)
    lines = out.stdout.strip().split("\n")
    hdr = lines[0].split(",")
    before, peak, prev = None, None, 0
    for ln in lines[1:]:
        r = dict(zip(hdr, ln.split(",")))
        if r["micro_batch"] != "0":
            continue
        tot = int(r["total"])
        if r["phase"] == "backward" and r["step"] == "head":
            if before is None:
                before, peak = prev, prev
            peak = max(peak, tot)
        elif before is not None:
            break
        prev = tot
    return peak - before


def measured_head_bwd(c, it, view):
    """The head's backward window in iteration `it` of curve c: the
    highest live bytes above the level at bwd:head, up to the next bwd
    mark (the last layer's: the norm's input gradient exists)."""
    s0, e0 = c.range("iter%d" % it)
    bwd = sorted((s, n[4:]) for s, _, n in c.marks if s0 <= s <= e0 and n.startswith("bwd:"))
    i = [n for _, n in bwd].index("head")
    t0, t1 = bwd[i][0], bwd[i + 1][0]
    level = c.live_at(t0, view)
    peak = level
    k0 = lb.bisect.bisect_left(c.times, t0)
    k1 = lb.bisect.bisect_left(c.times, t1)
    live = level
    for k in range(k0, k1):
        live += view[k]
        peak = max(peak, live)
    return peak - level


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    memledger, models = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    xc.RMSNorm.forward = lb.rmsnorm_forward
    xc.GemmaRMSNorm.forward = lb.gemma_rmsnorm_forward

    def bwd_mark(name):
        with lb.Mark("bwd:" + name):
            pass
    tw.BWD_MARK[0] = bwd_mark
    passed = failed = 0
    for fn in ("llama.yaml", "gemma.yaml"):
        path = os.path.join(models, fn)
        with open(path) as fh:
            doc = xc.load(fh)
        B, T = doc["training"]["micro_batch"], doc["training"]["seq_len"]
        for prec, dt in PRECISIONS.items():
            def build(doc=doc, dt=dt):
                torch.manual_seed(1)
                xc.INPLACE[0] = True
                m = xc.build(doc)
                # the weights in the stream's dtype; the rotary's inv_freq
                # stays fp32 (HF's forward takes it .float())
                for q in m.parameters():
                    q.data = q.data.to(dt)
                m.train()
                return m
            c, _ = lb.run_loop(build, lambda m: xc.batch_for(doc, m, B, T), lb.model_step_fn(False),
                               "sgd", "for-loop", "fused")
            view, _ = c.device_view()
            # PowBackward0's two temporaries (pow_backward's grad * (2 *
            # x.pow(1)), in 2.x as in 1.13) are in both: the plan's node
            # counts them as its scratch
            got = measured_head_bwd(c, 1, view)
            want = planned_head_bwd(memledger, path, prec, B, T)
            ok = not c.errors and got == want
            print("%s %s %s: the fused head's backward peak above its start: measured %d, "
                  "planned %d%s"
                  % ("ok  " if ok else "FAIL", doc["name"], prec, got, want,
                     "" if not c.errors else " (oracle errors %s)" % c.errors[:2]))
            passed, failed = passed + ok, failed + (not ok)
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
