#!/usr/bin/python3
"""Per-rank saved activations under expert parallelism, against real PyTorch.

The Mixtral and Qwen2-MoE twins of twins.py (their attention, norms, router
and SwiGLU experts as Hugging Face writes them) with the experts split over
EP ranks, one process each (torch.multiprocessing, spawn), gloo on the CPU,
and the tokens dispatched as Megatron-core's MoEAlltoAllTokenDispatcher
dispatches them (megatron/core/transformer/moe/token_dispatcher.py,
moe_utils.py permute, sort_chunks_by_idxs, unpermute):

- the router is the model's (gate, softmax in fp32, the top-k, the
  renormalisation); twins.FIXED_ROUTING sends pair p of a rank to expert
  p mod E, so every expert takes as many rows from every rank;
- every rank's count of its pairs for each expert all-gathered (preprocess,
  no grad: the splits);
- permute: the pairs sorted by expert (a stable sort of the experts'
  indices, no grad), their tokens gathered with index_select (it keeps its
  index, the pairs' tokens) and their weights by the pairs' order (the
  index keeps it);
- an all-to-all (an autograd Function: the gradient goes back the same
  way; it saves nothing) brings each rank the rows of its E / ep experts,
  which a cat sorts by local expert (sort_chunks_by_idxs); the weights the
  same way;
- each local expert runs on its slice of the sorted rows, its output
  weighted by its slice of the sorted weights (Hugging Face's loop's
  weighting); the outputs are concatenated, sorted back by source rank,
  sent back by a second all-to-all and summed into the tokens by
  scatter_add_ (it keeps only its index);
- Qwen2-MoE's shared expert runs on every token of the rank, as without
  expert parallelism.

Each rank counts what autograd saves during the forward with crosscheck.py's
Recorder (saved_tensors_hooks; each storage once; parameters, buffers and
the batch excluded; attributed to the block running), and checks that the
split model is the single-device one: its loss on its own batch, the
gradients of what it holds (the router, attention and norms: its own
batch's; each local expert's: every rank's batch's, summed with an
all-reduce of the single-device gradients), within fp32 rounding.

Hand derivation, one layer block on one rank (fp32, 4 B an element; B
micro-batch, T sequence, D hidden; P = k B T the rank's (token, expert)
pairs; R the rows its experts take, here P; F_e an expert's width):

  the layer without its experts, as twins.Mixtral keeps it (attention,
  norms, the router; Qwen2-MoE's shared expert): measured on this process
  with the experts' part taken away, i.e. the single-device block less what
  its experts' loop keeps (below)
  the single-device experts' loop over the N = P rows: torch.where's int64
    (row, slot) pairs 2 N 8, the gathered rows N D, w1's, silu's, w3's
    outputs and the product 4 N F_e, w2's output and the gathered weights
    N D + N, index_add_'s source N D  (4 B each but the indices)
  the dispatch and the rank's experts: the pairs' order and their tokens
    2 P 8 (int64), the sorted rows R D, the sorted weights R, the
    experts' four intermediates 4 R F_e and outputs R D

The plan: `memledger plan MODEL --format json --ep N --dp N` (fp32, no
checkpointing); each layer block's activations_saved must be the measured
bytes less crosscheck.known_1_13's (the RMSNorms' x^2 and the attention
scale's 0-dim double), byte for byte.

usage: ep_twin.py MEMLEDGER MODELS_DIR
Prints one line per check and ends with "N passed, N failed".
"""
import json
import os
import subprocess
import sys
import tempfile
import types

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import twins as tw  # noqa: E402  (the reference implementations)
from crosscheck import Recorder, known_1_13  # noqa: E402  (the measurement)

EP_SIZES = (2, 3)
SENT = [0]  # bytes this rank's all-to-alls sent to the other ranks


def skewed(n, k, E):
    """A routing with expert 0 the busiest, 1.5 times its share: 3/4 of the
    tokens choose it and one of 1, 2, 3 in turn, the last quarter two of
    1, 2, 3 in turn ((1, 2), (2, 3), (3, 1)): per rank 3n/4 pairs for
    expert 0 and 5n/12 for each other, as training.expert_imbalance 1.5
    has the group's (busiest 1.5 x 2n/4, the rest shared evenly)."""
    assert (k, E) == (2, 4) and n % 12 == 0
    first = [[0, 1 + t % 3] for t in range(3 * n // 4)]
    rest = [[[1, 2], [2, 3], [3, 1]][t % 3] for t in range(n // 4)]
    return torch.tensor(first + rest)


class AllToAll(torch.autograd.Function):
    """mappings.py _AllToAll: rows sent by in_splits, received by out_splits;
    the gradient sent back the other way; nothing saved."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits):
        ctx.splits = (out_splits, in_splits)
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
        SENT[0] += sent(x, in_splits)
        return out

    @staticmethod
    def backward(ctx, g):
        out_splits, in_splits = ctx.splits
        gi = g.new_empty((sum(in_splits),) + tuple(g.shape[1:]))
        dist.all_to_all_single(gi, g.contiguous(), in_splits, out_splits)
        SENT[0] += sent(g, out_splits)
        return gi, None, None


def sent(x, splits):
    """The bytes of x's rows an all-to-all sends to the other ranks."""
    row = x[0].numel() * x.element_size() if x.dim() else x.element_size()
    return row * sum(n for j, n in enumerate(splits) if j != dist.get_rank())


def ep_mlp(s, b, h, ep):
    """MixtralSparseMoeBlock's router, then the alltoall dispatcher around
    the rank's experts (b.experts holds only them)."""
    B, T, D = h.shape
    h = h.view(-1, D)
    N = h.shape[0]
    w = F.softmax(b.router(h), dim=1, dtype=torch.float)
    chosen = tw.fixed_routing(N, s.k, s.E)
    w = w.gather(1, chosen)
    if s.renorm:
        w /= w.sum(dim=-1, keepdim=True)
    w = w.to(h.dtype)
    El = s.E // ep
    with torch.no_grad():  # the dispatch's bookkeeping
        flat = chosen.reshape(-1)
        order = torch.sort(flat, stable=True)[1]
        tok = order // s.k
        counts = torch.bincount(flat, minlength=s.E)
        # every rank's counts of every expert, all-gathered (preprocess:
        # gather_from_sequence_parallel_region over the tp x ep group);
        # the rank keeps its local experts' columns
        every = [torch.empty_like(counts) for _ in range(ep)]
        dist.all_gather(every, counts)
        me = dist.get_rank()
        recv = torch.stack(every)[:, me * El:(me + 1) * El].reshape(-1)
        SENT[0] += counts.element_size() * s.E * (ep - 1)
    in_splits = counts.view(ep, El).sum(1).tolist()
    out_splits = recv.view(ep, El).sum(1).tolist()
    sizes = recv.tolist()  # received chunks: (source rank j, local expert e)
    xp = h.index_select(0, tok)
    wp = w.reshape(-1)[order]
    xr = AllToAll.apply(xp, out_splits, in_splits)
    wr = AllToAll.apply(wp, out_splits, in_splits)
    by_expert = [j * El + e for e in range(El) for j in range(ep)]
    xc, wc = torch.split(xr, sizes), torch.split(wr, sizes)
    xs = torch.cat([xc[i] for i in by_expert])
    ws = torch.cat([wc[i] for i in by_expert])
    del xc, wc, wr
    outs, start = [], 0
    for e in range(El):
        n = sum(sizes[j * El + e] for j in range(ep))
        ex, x = b.experts[e], xs[start:start + n]
        outs.append(ex.w2(F.silu(ex.w1(x)) * ex.w3(x)) * ws[start:start + n, None])
        start += n
    cat = torch.cat(outs)
    del outs
    oc = torch.split(cat, [sizes[i] for i in by_expert])
    back = torch.cat([oc[by_expert.index(j * El + e)] for j in range(ep) for e in range(El)])
    del oc, cat
    yb = AllToAll.apply(back, in_splits, out_splits)
    del back
    out = torch.zeros((N, D), dtype=h.dtype).scatter_add_(0, tok[:, None].expand(-1, D), yb)
    del xp, xr, yb
    if hasattr(b, "shared"):
        sh = b.shared.w2(F.silu(b.shared.w1(h)) * b.shared.w3(h))
        out = out + torch.sigmoid(b.shared_gate(h)) * sh
    return out.reshape(B, T, D)


def split_model(ref, rank, ep):
    """The rank's model: the single-device one's weights, its E / ep
    experts, the dispatch in place of the experts' loop."""
    import copy
    model = copy.deepcopy(ref)
    El = model.E // ep
    for b in model.blocks:
        b.experts = torch.nn.ModuleList(list(b.experts)[rank * El:(rank + 1) * El])
    for p in model.parameters():
        p.grad = None
    model.mlp = types.MethodType(lambda s, b, h: ep_mlp(s, b, h, ep), model)
    return model


def grad_errors(ref, model, rank, ep):
    """The largest relative gap between the split model's gradients and the
    single-device ones (local experts: summed over the ranks' batches)."""
    worst, name = 0.0, ""
    El = ref.E // ep
    rp = dict(ref.named_parameters())
    summed = {}  # every expert's, in the same order on every rank
    for n, p in ref.named_parameters():
        if ".experts." in n:
            summed[n] = p.grad.clone()
            dist.all_reduce(summed[n])
    for n, p in model.named_parameters():
        parts = n.split(".")
        if "experts" in parts:  # blocks.i.experts.e.wX
            i = parts.index("experts")
            parts[i + 1] = str(rank * El + int(parts[i + 1]))
            want = summed[".".join(parts)]
        else:
            want = rp[n].grad
        err = ((p.grad - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
        if err > worst:
            worst, name = err, n
    return worst, name


def rank_main(rank, ep, init_file, out_dir, jobs):
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=ep)
    tw.FIXED_ROUTING[0] = True
    results = []
    for path, routing in jobs:
        tw.ROUTING[0] = skewed if routing == "skewed" else None
        SENT[0] = 0
        with open(path) as fh:
            doc = tw.load(fh)
        tr = doc.get("training", {})
        B, T = tr.get("micro_batch", 2), tr.get("seq_len", 16)
        torch.manual_seed(1)
        ref = tw.build(doc)
        torch.manual_seed(100 + rank)  # each rank its own batch
        batch = tw.batch_for(doc, ref, B, T)
        rrec = Recorder(ref)
        for t in batch:
            rrec.exclude.add(t.storage().data_ptr())
        with torch.autograd.graph.saved_tensors_hooks(rrec.pack, lambda t: t):
            ref_loss = ref.run(rrec, batch, False)
        ref_loss.backward()
        model = split_model(ref, rank, ep)
        rec = Recorder(model)
        for t in batch:
            rec.exclude.add(t.storage().data_ptr())
        with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t):
            loss = model.run(rec, batch, False)
        loss.backward()
        gerr, gname = grad_errors(ref, model, rank, ep)
        results.append({"path": path, "routing": routing, "blocks": rec.per_block(),
                        "ref_blocks": rrec.per_block(), "sent": SENT[0],
                        "loss": loss.item(), "ref_loss": ref_loss.item(),
                        "grad_err": gerr, "grad_worst": gname})
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as fh:
        json.dump(results, fh)
    dist.barrier()
    dist.destroy_process_group()


def run_world(ep, jobs):
    with tempfile.TemporaryDirectory(prefix="ep_twin.") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        mp.start_processes(rank_main, args=(ep, init_file, tmp, jobs), nprocs=ep, join=True,
                           start_method="spawn")
        out = []
        for r in range(ep):
            with open(os.path.join(tmp, "rank%d.json" % r)) as fh:
                out.append(json.load(fh))
        return out


def hand_experts(m, B, T, R):
    """(the single-device experts' loop, the dispatch and the rank's experts
    on its R rows) in bytes."""
    D, k = m["hidden"], m.get("experts_per_tok", 2)
    Fe = m.get("expert_ffn", m["ffn"])
    N = P = k * B * T
    loop = 2 * N * 8 + 4 * (N * D + 4 * N * Fe + N * D + N + N * D)
    dispatch = 2 * P * 8 + 4 * (R * D + R + 4 * R * Fe + R * D)
    return loop, dispatch


def rows(m, B, T, ep, rank, routing):
    """The rows rank's experts take: the group's pairs of its experts (the
    skewed routing: 3n/4 pairs a rank for expert 0, 5n/12 for the others)."""
    k, E = m.get("experts_per_tok", 2), m["experts"]
    P, El = k * B * T, E // ep
    if routing == "balanced":
        return P
    n = B * T
    per = [3 * n // 4] + [5 * n // 12] * (E - 1)
    return ep * sum(per[rank * El:(rank + 1) * El])


def hand_sent(m, B, T, ep):
    """What a rank's collectives send to the others in one iteration, the
    routing balanced: forward its counts of every expert (E int64) to each
    other rank (an all-gather), then the tokens and weights of its P pairs
    and the outputs of its R = P rows, (ep - 1)/ep of each; the two
    gradients back likewise (the plan's communication.expert_parallel...)."""
    D, k, E = m["hidden"], m.get("experts_per_tok", 2), m["experts"]
    P = k * B * T
    fwd = P * (4 * D + 4) + P * 4 * D
    bwd = P * 4 * D + P * (4 * D + 4)
    return m["layers"] * ((fwd + bwd) * (ep - 1) // ep + E * 8 * (ep - 1))


def plan(memledger, path, B, T, ep, routing):
    args = [memledger, "plan", path, "--format", "json", "--micro-batch", str(B), "--seq-len",
            str(T), "--precision", "fp32", "--checkpoint", "none", "--ep", str(ep), "--dp",
            str(ep), "--allocator", "none"]
    if routing == "skewed":
        args += ["--expert-imbalance", "1.5"]
    return subprocess.run(args, capture_output=True, text=True), args


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    memledger, models = sys.argv[1], sys.argv[2]
    files = sorted(os.path.join(models, f) for f in os.listdir(models)
                   if f.endswith(".yaml") and f.startswith(("mixtral", "qwen2moe")))
    passed = failed = 0

    def check(label, ok, detail):
        nonlocal passed, failed
        print("%s %s: %s" % ("ok  " if ok else "FAIL", label, detail))
        if ok:
            passed += 1
        else:
            failed += 1

    docs = {}
    for path in files:
        with open(path) as fh:
            docs[path] = tw.load(fh)
    for ep in EP_SIZES:
        jobs = [(p, "balanced") for p, d in docs.items() if d["model"]["experts"] % ep == 0]
        # the skewed routing on Mixtral's twin (4 experts, top-2) over 2 ranks
        jobs += [(p, "skewed") for p, d in docs.items()
                 if ep == 2 and (d["model"]["experts"], d["model"].get("experts_per_tok", 2)) ==
                 (4, 2)]
        try:
            ranks = run_world(ep, jobs)
        except Exception as e:  # a rank raised: its traceback is on stderr
            check("ep%d ranks" % ep, False, "%s: %s" % (type(e).__name__, e))
            continue
        for j, (path, routing) in enumerate(jobs):
            doc = docs[path]
            m, tr = doc["model"], doc.get("training", {})
            B, T = tr.get("micro_batch", 2), tr.get("seq_len", 16)
            label = "%s ep%d %s" % (doc["name"], ep, routing)
            extra = known_1_13(doc, B, T)
            out, args = plan(memledger, path, B, T, ep, routing)
            got, comm = {}, None
            if out.returncode != 0:
                check(label + " plan", False, "%s exited %d: %s" % (" ".join(args),
                                                                   out.returncode,
                                                                   out.stderr.strip()))
            else:
                d = json.loads(out.stdout)
                got = {x["name"]: x["activations_saved"] for x in d["blocks"]}
                comm = d["communication"].get("expert_parallel_bytes_per_device")
            for rank, res in enumerate(ranks):
                r = res[j]
                loop, dispatch = hand_experts(m, B, T, rows(m, B, T, ep, rank, routing))
                if routing == "balanced":
                    want = hand_sent(m, B, T, ep)
                    check("%s rank%d all-to-alls" % (label, rank),
                          r["sent"] == want and comm == want,
                          "sent %d B, by hand %d, planned %s" % (r["sent"], want, comm))
                same = (abs(r["loss"] - r["ref_loss"]) <= 1e-5 * abs(r["ref_loss"])
                        and r["grad_err"] <= 1e-4)
                check("%s rank%d matches single device" % (label, rank), same,
                      "loss %.7f vs %.7f, largest gradient gap %.1e (%s)"
                      % (r["loss"], r["ref_loss"], r["grad_err"], r["grad_worst"]))
                for i in range(m["layers"]):
                    blk = "block.%d" % i
                    whole = r["ref_blocks"].get(blk, 0)
                    want = whole - loop + dispatch
                    meas = r["blocks"].get(blk, 0)
                    check("%s rank%d %s" % (label, rank, blk), meas == want,
                          "measured %d, by hand %d (single device %d - its experts' loop %d + "
                          "dispatch %d)" % (meas, want, whole, loop, dispatch))
                    # the plan is the fullest rank's: rank 0 (the busiest expert)
                    if got and (routing == "balanced" or rank == 0):
                        planned = meas - extra.get(blk, 0)
                        check("%s rank%d %s planned" % (label, rank, blk),
                              got.get(blk) == planned,
                              "planned %s, measured less the 1.13 artefacts %d"
                              % (got.get(blk), planned))
    print("%d passed, %d failed" % (passed, failed))
    if passed + failed == 0:
        print("FAIL no model under %s: nothing was checked" % models)
        return 1
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
