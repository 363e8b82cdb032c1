#!/usr/bin/python3
"""Per-stage memory under pipeline parallelism, against real PyTorch.

The Llama twin of twins.py (its embedding, its layers through
twins.Llama.block, its final norm, LM head and cross-entropy) cut into p
pipeline stages (p = 2 and 4), the layers split evenly, the embedding on
stage 0, the final norm, the head and the loss on stage p - 1; one process
per stage (torch.multiprocessing, spawn), gloo on the CPU (file://
rendezvous, one thread each). The step runs as Megatron-LM runs it
(megatron/core/pipeline_parallel/schedules.py,
forward_backward_pipelining_without_interleaving, transcribed below with
its locals, whose lifetimes matter here):

- 1F1B: stage r runs w = min(m, p - r - 1) warmup forwards, then m - w
  times one forward and one backward (steady state), then w backwards
  (cooldown);
- GPipe: the same loop with every micro-batch a warmup one (all m
  forwards, then all m backwards; Megatron has no GPipe function: this is
  what its loop does when p - r - 1 >= m);
- m micro-batches a step (m = 2 and 8), then AdamW (foreach) and
  zero_grad(set_to_none=True).

A stage receives its input into a fresh tensor (requires_grad=True,
p2p_communication.py _communicate), keeps it until that micro-batch's
backward and sends its .grad back; it sends its output forward and frees
the output's storage, keeping its grad_fn (schedules.py
deallocate_output_tensor with deallocate_pipeline_outputs); its backward is
schedules.py custom_backward (the engine called directly: with the output
deallocated, torch.autograd.backward would refuse the gradient's shape); the
last stage divides its loss by m (forward_step_calc_loss). The micro-batch's
tokens (stage 0) and labels (stage p - 1) are copied "to the device" at its
forward (get_batch: a clone of a pool made before the measurement), and
live as long as autograd keeps them.

Measured on each stage:

1. what ONE micro-batch's forward saves for backward on the stage, per
   block ("embedding" or "rotary", "block.<i>" with the global layer index,
   "head", "loss"), with crosscheck.py's Recorder (saved_tensors_hooks; each
   storage once; parameters, buffers and the batch excluded). Every stage
   makes its own rotary tables (cos and sin, 1 x T x dh each, what
   twins.Llama.run makes in its embedding block): stage 0 counts them in
   "embedding", the others in "rotary". The received input is the first
   layer's RMSNorm input: it is in that layer's saved bytes.
2. the live bytes of a step, measured as livebytes.py measures them (the
   profiler's memory events, every free paired with its allocation, the
   device view without the CPU-only artefacts: 1.13's RMSNorm x^2 from the
   mean on, 0-dim Python scalars, 1.13 foreach Adam's second denominator).
   Two steps; the second (steady) one is compared. Its peak, where it falls
   (the micro-batch, forward or backward, the op, the block whose backward
   runs) and what is alive there, by origin: parameters, optimizer states,
   gradients, each micro-batch's forward (its saved tensors, its batch
   tensors) and each backward's tensors.
3. that the pipeline computes what the single-device twin computes: each
   stage's accumulated gradients and the step's loss, and the bytes each
   stage sends in a step.

Hand derivation (fp32, 4 B an element; B 2, T 24, D 64, H 8, dh 8, KV 2,
F 160, V 173, 4 layers):

  BTD = B*T*D*4 = 12,288   BTF = B*T*F*4 = 30,720   BTV = B*T*V*4 = 33,216
  DF  = D*F*4   = 40,960 (down_proj's weight)   tables = 2*T*dh*4 = 1,536
  batch tensor (tokens or labels, int64) = B*T*8 = 384

  one layer's saved bytes (tp_twins.py's derivation at tp 1): 283,008
  (PyTorch 1.13: 307,592, with its two x^2 and the attention scale);
  the head (the final norm: input, x*rsqrt, output, rsqrt) 3*BTD + B*T*4 =
  37,056 (1.13: + x^2 = 49,344); the loss (log-softmax output and
  nll_loss's total_weight) BTV + 4 = 33,220 (1.13: + the division by m's
  Python int, saved as a 0-dim double = 33,228).

  A_r, one micro-batch's saved bytes on stage r (as planned):
    p 2: stage 0  tables + 2 layers          = 1,536 + 566,016          = 567,552
         stage 1  tables + 2 layers + head + loss                        = 637,828
    p 4: stage 0  tables + 1 layer           = 284,544; stages 1, 2 the same;
         stage 3  tables + 1 layer + head + loss                         = 354,820
  H_r, what one held micro-batch keeps on the stage: A_r + its batch
    tensor on stage 0 and on stage p - 1 (384): 567,936 / 638,212;
    284,928 / 284,544 / 284,544 / 355,204.
  P_r, the stage's parameters (bytes): p 2: 372,992 / 373,248 (embedding
    or final norm + head 44,544, and 2 layers of 164,352); p 4: 208,640 /
    164,352 / 164,352 / 208,896. Resident R = P + AdamW's two states 2P +
    the rotary inv_freq buffer 16 = 3P + 16; gradients P once allocated
    (zero_grad(set_to_none) drops them: the step's first backward makes
    them).

  In flight: the micro-batches whose saved activations are alive at once,
  each with its received input (inside A_r) and its batch tensor: at the
  first backward of the step, 1F1B min(m, p - r), GPipe m; at the second,
  the same in 1F1B's steady state (m - w >= 2), one fewer otherwise (a
  cooldown backward). The peak is one backward's start on top of the held
  micro-batches, at one of two ops of the stage's last block, whichever is
  larger:

  a stage before the last (the received gradient g, BTD, held by the
  schedule's output_tensor_grad through the backward):
    first backward (no gradients yet but down_proj's, stolen by
    AccumulateGrad), at the SwiGLU product's backward (mul: both operand
    gradients made, the product's own gradient alive, the product itself,
    down_proj's saved input, freed):
      R + k*H + DF + BTD + 3*BTF - BTF
    a later backward (all gradients resident), at down_proj's weight
    gradient (mm: the input gradient BTF made, the weight's DF before it
    is added into .grad), with on stages r > 0 the previous backward's
    input gradient (BTD), kept by the schedule's input_tensor_grad until
    this backward_step returns:
      R + P + k*H + [r > 0]*BTD + BTD + BTF + DF
  the last stage (no received gradient; the seed ones_like of the
  deallocated (1,) output and the loss's gradient after the division by m,
  4 B each):
    first backward, at the last layer's SwiGLU mul (the loss's, head's and
    product's saved tensors freed; gradients so far: the head's V*D*4 and
    the final norm's D*4, and down_proj's):
      R + (V*D + D)*4 + DF + k*H - (33,220 + 384 + 37,056 + BTF)
        + BTD + 3*BTF + 8
    a later backward, at the log-softmax's backward (nll_loss's gradient
    and the log-softmax's, BTV each; the labels and total_weight freed),
    with the previous input gradient when p > 1:
      R + P + [p > 1]*BTD + k*H - 388 + 2*BTV + 8

  The figures (R = 3P + 16; k: micro-batches held at the step's first
  backward and at its second; the larger candidate is the peak, in that
  backward at that op; hand_table() prints the same):

  p r sched m   R          k  first       k  later       peak
  2 0 1f1b  2  1,118,992  2  2,369,552  1  2,143,888   2,369,552  B0 mul
  2 0 1f1b  8  1,118,992  2  2,369,552  2  2,711,824   2,711,824  B1 mm
  2 0 gpipe 2  1,118,992  2  2,369,552  1  2,143,888   2,369,552  B0 mul
  2 0 gpipe 8  1,118,992  8  5,777,168  7  5,551,504   5,777,168  B0 mul
  2 1 1f1b  2  1,119,760  1  1,846,552  1  2,209,560   2,209,560  B1 log_softmax bwd
  2 1 1f1b  8  1,119,760  1  1,846,552  1  2,209,560   2,209,560  B1 log_softmax bwd
  2 1 gpipe 2  1,119,760  2  2,484,764  1  2,209,560   2,484,764  B0 mul
  2 1 gpipe 8  1,119,760  8  6,314,036  7  6,038,832   6,314,036  B0 mul
  4 0 1f1b  2    625,936  2  1,310,480  1  1,203,472   1,310,480  B0 mul
  4 0 1f1b  8    625,936  4  1,880,336  4  2,058,256   2,058,256  B1 mm
  4 0 gpipe 2    625,936  2  1,310,480  1  1,203,472   1,310,480  B0 mul
  4 0 gpipe 8    625,936  8  3,020,048  7  2,913,040   3,020,048  B0 mul
  4 1 1f1b  2    493,072  2  1,176,848  1  1,038,224   1,176,848  B0 mul
  4 1 1f1b  8    493,072  3  1,461,392  3  1,607,312   1,607,312  B1 mm
  4 1 gpipe 2    493,072  2  1,176,848  1  1,038,224   1,176,848  B0 mul
  4 1 gpipe 8    493,072  8  2,884,112  7  2,745,488   2,884,112  B0 mul
  4 2 1f1b  2    493,072  2  1,176,848  1  1,038,224   1,176,848  B0 mul
  4 2 1f1b  8    493,072  2  1,176,848  2  1,322,768   1,322,768  B1 mm
  4 2 gpipe 2    493,072  2  1,176,848  1  1,038,224   1,176,848  B0 mul
  4 2 gpipe 8    493,072  8  2,884,112  7  2,745,488   2,884,112  B0 mul
  4 3 1f1b  2    626,704  1  1,070,488  1  1,269,144   1,269,144  B1 log_softmax bwd
  4 3 1f1b  8    626,704  1  1,070,488  1  1,269,144   1,269,144  B1 log_softmax bwd
  4 3 gpipe 2    626,704  2  1,425,692  1  1,269,144   1,425,692  B0 mul
  4 3 gpipe 8    626,704  8  3,556,916  7  3,400,368   3,556,916  B0 mul

  e.g. p 2, stage 0, 1F1B, m 8, at the second backward's down_proj mm:
    1,118,992 + 372,992 + 2*567,936 + 12,288 + 30,720 + 40,960 = 2,711,824;
  GPipe, m 8, at the first backward's SwiGLU mul:
    1,118,992 + 8*567,936 + 40,960 + 12,288 + 2*30,720 = 5,777,168;
  p 4, stage 3, 1F1B, at the second backward's log-softmax:
    626,704 + 208,896 + 12,288 + 355,204 - 388 + 2*33,216 + 8 = 1,269,144.

llama-pp-t48.yaml, the same model at 48 tokens, puts the peaks elsewhere:
the attention's B·H·T² grows four times, so a stage before the last peaks
in the last layer's softmax backward, after its first residual sum into
the received gradient g, which the schedule's output_tensor_grad holds:
1.13's input buffer adds out of place (2.x too, can_accumulate_inplace
failing on the held g), so the sum is a new B·T·D beside g until the
micro-batch's backward ends. p 2, stage 0, 1F1B, m 2, B0's
_softmax_backward_data in block.1:
  R 1,118,992 + gradients so far (down, up, gate 3 DF, ln2's D*4, o_proj's
  D*D*4) 139,520 + F1 held (A 1,282,560 and its tokens 768) + F0 less
  block.1's MLP (4 BTF), ln2 (4 BTD, 1.13's x^2 among them, and B*T*4),
  o_proj's input (BTD): 1,282,560 - 369,024 = 913,536, and its tokens 768
  + g, the sum, v's gradient (3 BTD 73,728) + the probabilities'
  gradient and softmax_backward_data's (2 B*H*T^2*4 294,912) + the GPU's
  softmax temporary (B*H*T^2*4 147,456) = 3,972,240 B,
the plan's figure (which before holding g was 24,576 B under). That
file's peaks are held against the plan, not the candidates (the checks of
the peak's value, place, in-flight count and ledger print as INFO lines);
every other check runs.

The forwards: a steady forward (1F1B, a forward after a backward: m > p -
r) on a stage before the last runs beside the gradient received for the
micro-batch before, which output_tensor_grad holds until the next receive
rebinds it (BTD more). Stage 0 of p 2, m 8 holds at its largest forward R
+ P + H + BTD + what the forward itself has made, against m 2's R + H +
the same (its largest forward is the step's first, beside the other held
micro-batch, no gradient made yet): P + BTD = 372,992 + 12,288 more
(2,667,216 against 2,281,936; test_parallel.c holds the plan to that
difference). The fullest stage's measured forward maximum (the last
stage's loss among its forwards; there, beside the logits, nll_loss's
0-dim output, 4 B, which the plan leaves out) is held against the plan's
forward and loss phases, to the byte.

The check: each stage's measured steady peak equals the larger candidate
to the byte, falls in that backward at that op, with exactly k
micro-batches' forwards alive there, each fully held one holding exactly
H_r; the optimizer step's maximum is R + 2P + 8 (the gradients, foreach
AdamW's square roots of exp_avg_sq, and the 0-dim double _foreach_div_
wraps the bias correction in: made inside aten::div_, the device view
keeps it; host memory on a GPU), below the peak.

The plan: `memledger plan MODEL --pp P --pp-schedule S --micro-batches M
--allocator none --format json` (fp32, no checkpointing, AdamW foreach,
logits released: Megatron computes the loss inside the model). Per stage:
its layers, parameters, in-flight count, activations_saved (the measured
bytes less the 1.13 artefacts, exactly), p2p_bytes (the bytes it sends in
a step, exactly) and the peak (within 1 % of the measured device view,
both printed; where they differ, the difference must add up from the
named items of the derivation above, or the check fails). A plan that exits non-zero fails
each planner comparison; the twin's checks still run.

PyTorch 1.13 and gloo: batch_isend_irecv runs on gloo (each op posted,
nothing coalesced), so the p2p is Megatron's batched path as written; the
backward is Megatron's custom_backward (Variable._execution_engine.
run_backward), which 1.13 has; the rest is livebytes.py's accounting.

usage: pp_twins.py MEMLEDGER MODELS_DIR
Prints one line per check and ends with "N passed, N failed".
"""
import bisect
import gc
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import crosscheck as xc  # noqa: E402  (the saved-bytes measurement, the 1.13 extras)
import livebytes as lb  # noqa: E402  (the live-bytes curve and its device view)
import twins as tw  # noqa: E402  (the reference implementations)
from tp_twins import hand_layer  # noqa: E402  (one layer's saved bytes, by hand)

P_SIZES = (2, 4)
CONFIGS = [(s, m) for s in ("1f1b", "gpipe") for m in (2, 8)]
STEPS = 2  # the second is compared
Mark = lb.Mark
TOL = 0.01


# --------------------------------------------------------------------------
# A stage of the twin

def stage_range(L, p, r):
    """Stage r's layers, an even split: [first, last + 1)."""
    return r * L // p, (r + 1) * L // p


def make_stage(doc, p, r):
    """twins.Llama built whole (seed 1: the same weights on every rank and
    in the single-device reference), cut to stage r's modules."""
    torch.manual_seed(1)
    model = tw.build(doc)
    a, b = stage_range(doc["model"]["layers"], p, r)
    model.blocks = nn.ModuleList(list(model.blocks)[a:b])
    if r > 0:
        model.embed = None
    if r < p - 1:
        model.norm = None
        model.lm_head = None
    model.pp = (p, r, a)
    return model


def get_batch(pool_item, p, r):
    """pretrain_gpt.py get_batch: this micro-batch's tokens on the first
    stage, its labels on the last, copied to the device (a clone here)."""
    idx, tgt = pool_item
    return (idx.clone() if r == 0 else None, tgt.clone() if r == p - 1 else None)


def stage_forward(model, rec, x, batch, m):
    """One micro-batch's forward on the stage: twins.Llama.run cut at the
    stage's edges. The embedding on stage 0, else the received activation;
    the rotary tables, which every stage makes for its layers; the layers
    (twins.Llama.block) under their global names; on the last stage the
    final norm, the head and the loss (twins.lm_loss), divided by m
    (schedules.py forward_step_calc_loss: output_tensor /= num_microbatches)."""
    p, r, a = model.pp
    idx, tgt = batch
    if r == 0:
        rec.block = "embedding"
        x = model.embed_tokens(idx)
    else:
        rec.block = "rotary"
    B, T = x.shape[:2]
    pos = torch.arange(T)[None]  # cache_position[None]: one row for the batch (LlamaModel.forward)
    cos, sin = model.rotary(x, pos)
    where = "embedding" if r == 0 else "rotary"
    rec.pinned[cos.storage().data_ptr()] = where
    rec.pinned[sin.storage().data_ptr()] = where
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None].expand(B, 1, T, T)
    if r == 0:
        tw.bwd_mark("embedding", x)
    for j, b in enumerate(model.blocks):
        name = "block.%d" % (a + j)
        rec.block = name
        x = model.block(b, x, cos, sin, mask, pos)
        tw.bwd_mark(name, x)
    del mask, pos, cos, sin
    if r < p - 1:
        return x
    rec.block = "head"
    loss = tw.lm_loss(rec, model.norm(x), model.lm_head, tgt)
    loss /= m
    return loss


class NoRec:
    """Stands for the Recorder where nothing is measured."""

    def __init__(self):
        self.pinned = {}
        self.block = None


# --------------------------------------------------------------------------
# Megatron's point-to-point communication and schedule

class P2P:
    """p2p_communication.py P2PCommunicator over gloo: _communicate makes
    the receive buffers first (torch.empty, requires_grad=True), posts the
    sends and receives in one batch_isend_irecv, then waits on each."""

    def __init__(self, p, r, shape):
        self.p, self.r, self.shape = p, r, shape
        self.sent = 0  # bytes sent, for the plan's p2p_bytes

    def _communicate(self, send_next=None, send_prev=None, recv_prev=False, recv_next=False):
        rp = torch.empty(self.shape, requires_grad=True) if recv_prev else None
        rn = torch.empty(self.shape, requires_grad=True) if recv_next else None
        # p2p_communication.py _batched_p2p_ops (batch_p2p_comm, Megatron's
        # default): the ops in its order, one batch_isend_irecv
        ops = []
        if send_prev is not None:
            ops.append(dist.P2POp(dist.isend, send_prev, self.r - 1))
            self.sent += send_prev.numel() * send_prev.element_size()
        if rp is not None:
            ops.append(dist.P2POp(dist.irecv, rp, self.r - 1))
        if send_next is not None:
            ops.append(dist.P2POp(dist.isend, send_next, self.r + 1))
            self.sent += send_next.numel() * send_next.element_size()
        if rn is not None:
            ops.append(dist.P2POp(dist.irecv, rn, self.r + 1))
        for q in dist.batch_isend_irecv(ops) if ops else []:
            q.wait()
        return rp, rn

    def recv_forward(self):
        return None if self.r == 0 else self._communicate(recv_prev=True)[0]

    def recv_backward(self):
        return None if self.r == self.p - 1 else self._communicate(recv_next=True)[1]

    def send_forward(self, y):
        if self.r < self.p - 1:
            self._communicate(send_next=y)

    def send_backward(self, g):
        if self.r > 0:
            self._communicate(send_prev=g)

    def send_forward_recv_backward(self, y):
        if self.r == self.p - 1:
            return None
        return self._communicate(send_next=y, recv_next=True)[1]

    def send_backward_recv_forward(self, g):
        if self.r == 0:
            return None
        return self._communicate(send_prev=g, recv_prev=True)[0]


def deallocate_output_tensor(out):
    """schedules.py deallocate_output_tensor (deallocate_pipeline_outputs):
    the sent output's storage freed, its grad_fn kept."""
    assert out._base is None
    out.data = torch.empty((1,), dtype=out.dtype)


def custom_backward(output, grad_output):
    """schedules.py custom_backward: the C++ engine called directly (the
    deallocated output's shape is no longer its gradient's)."""
    if grad_output is None:
        grad_output = torch.ones_like(output, memory_format=torch.preserve_format)
    torch.autograd.Variable._execution_engine.run_backward(
        (output,), (grad_output,), False, False, (), True, True)


def backward_step(input_tensor, output_tensor, output_tensor_grad):
    """schedules.py backward_step (deallocate_pipeline_outputs)."""
    if input_tensor is not None:
        input_tensor.retain_grad()
    custom_backward(output_tensor, output_tensor_grad)
    return None if input_tensor is None else input_tensor.grad


def schedule_order(p, r, m, sched):
    """The stage's forwards and backwards in order: [("F", i) | ("B", i)]."""
    w = m if sched == "gpipe" else min(p - r - 1, m)
    out = [("F", i) for i in range(w)]
    for i in range(m - w):
        out += [("F", i + w), ("B", i)]
    return out + [("B", m - w + i) for i in range(w)]


def run_schedule(comm, m, sched, forward):
    """schedules.py forward_backward_pipelining_without_interleaving, line
    for line with its locals (input_tensor_grad and output_tensor_grad live
    until rebound), forward_only False. Ranges F<i> and B<i> mark each
    micro-batch's forward and backward, each with the receive of its input
    (the activation, or the gradient)."""
    p, r = comm.p, comm.r
    w = m if sched == "gpipe" else min(p - r - 1, m)
    rem = m - w
    input_tensors, output_tensors = [], []
    for i in range(w):
        with Mark("F%d" % i):
            input_tensor = comm.recv_forward()
            output_tensor = forward(i, input_tensor)
            comm.send_forward(output_tensor)
            input_tensors.append(input_tensor)
            output_tensors.append(output_tensor)
            deallocate_output_tensor(output_tensor)
    if rem > 0:
        with Mark("F%d" % w):
            input_tensor = comm.recv_forward()
    for i in range(rem):
        last_iteration = i == rem - 1
        with Mark("F%d" % (i + w)):
            output_tensor = forward(i + w, input_tensor)
        with Mark("B%d" % i):
            output_tensor_grad = comm.send_forward_recv_backward(output_tensor)
        with Mark("F%d" % (i + w)):
            input_tensors.append(input_tensor)
            output_tensors.append(output_tensor)
            deallocate_output_tensor(output_tensor)
        with Mark("B%d" % i):
            input_tensor = input_tensors.pop(0)
            output_tensor = output_tensors.pop(0)
            input_tensor_grad = backward_step(input_tensor, output_tensor, output_tensor_grad)
        if last_iteration:
            input_tensor = None
            with Mark("B%d" % i):
                comm.send_backward(input_tensor_grad)
        else:
            with Mark("F%d" % (i + w + 1)):
                input_tensor = comm.send_backward_recv_forward(input_tensor_grad)
    for i in range(w):
        with Mark("B%d" % (rem + i)):
            input_tensor = input_tensors.pop(0)
            output_tensor = output_tensors.pop(0)
            output_tensor_grad = comm.recv_backward()
            input_tensor_grad = backward_step(input_tensor, output_tensor, output_tensor_grad)
            comm.send_backward(input_tensor_grad)


# --------------------------------------------------------------------------
# One rank

def init_rank(rank, p, init_file):
    """A stage's process: one thread, gloo over the file rendezvous, the
    RMSNorm forward with its x^2 tagged (the same forward)."""
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=p)
    tw.RMSNorm.forward = lb.rmsnorm_forward


def load_job(path, n):
    """A model file's doc, its (B, T, D), and n micro-batches made before
    anything is measured (the data loader's host memory)."""
    with open(path) as fh:
        doc = tw.load(fh)
    tr = doc.get("training", {})
    B, T, D = tr.get("micro_batch", 2), tr.get("seq_len", 16), doc["model"]["hidden"]
    torch.manual_seed(7)
    tmp = tw.build(doc)
    pool = [tw.batch_for(doc, tmp, B, T) for _ in range(n)]
    del tmp
    return doc, (B, T, D), pool


def finish_rank(rank, out_dir, out):
    """Writes a stage's results for run_world, and leaves the group."""
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as fh:
        json.dump(out, fh)
    dist.barrier()
    dist.destroy_process_group()


def rank_main(rank, p, init_file, out_dir, jobs):
    """One pipeline stage: for each model file, its saved bytes, then each
    (schedule, m) of CONFIGS; writes what it measured to out_dir."""
    init_rank(rank, p, init_file)
    out = []
    for path in jobs:
        doc, (B, T, D), pool = load_job(path, STEPS * max(m for _, m in CONFIGS))
        res = {"path": path, "saved": measure_saved(doc, p, rank, pool, B, T, D), "configs": []}
        for sched, m in CONFIGS:
            res["configs"].append(run_config(doc, p, rank, pool, sched, m, B, T, D))
        out.append(res)
    finish_rank(rank, out_dir, out)


def reference_step(doc, pool, m):
    """The single-device twin's step over the first m micro-batches (seed 1,
    as the stages are built): its parameters by name, with their gradients,
    and its loss."""
    torch.manual_seed(1)
    ref = tw.build(doc)
    ref_loss = 0.0
    for i in range(m):
        loss = ref.run(NoRec(), pool[i], False) / m
        ref_loss += loss.item()
        loss.backward()
    return dict(ref.named_parameters()), ref_loss


def grad_error(models, refp):
    """The largest relative gap of the stages' (or chunks') gradients to the
    single device's, and the parameter it is at: a model's block k is the
    reference's block (its first layer, pp[2]) + k."""
    worst, worst_name = 0.0, ""
    for model in models:
        a = model.pp[2]
        for n, q in model.named_parameters():
            rn = n
            if n.startswith("blocks."):
                k, rest = n.split(".", 2)[1:]
                rn = "blocks.%d.%s" % (a + int(k), rest)
            want = refp[rn].grad
            err = ((q.grad - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
            if err >= worst:
                worst, worst_name = err, rn
    return worst, worst_name


def measure_saved(doc, p, r, pool, B, T, D):
    """One micro-batch's forward on the stage under the Recorder (no
    communication: a stage r > 0 takes a random activation)."""
    model = make_stage(doc, p, r)
    rec = xc.Recorder(model)
    batch = get_batch(pool[0], p, r)
    for t in batch:
        if t is not None:
            rec.exclude.add(t.storage().data_ptr())
    x = torch.randn(B, T, D, requires_grad=True) if r > 0 else None
    with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t):
        stage_forward(model, rec, x, batch, 1)
    return {"blocks": rec.per_block(), "params": sum(q.numel() for q in model.parameters())}


def run_config(doc, p, r, pool, sched, m, B, T, D):
    t0 = time.time()
    losses, batch_ptrs = [], []

    def forward_of(model, step, measured):
        def forward(i, x):
            batch = get_batch(pool[step * m + i], p, r)
            if measured:
                batch_ptrs.extend(t.data_ptr() for t in batch if t is not None)
            rec = lb.Blocks()
            try:
                y = stage_forward(model, rec, x, batch, m)
            finally:
                rec.close()
            if r == p - 1:
                losses.append(y.item())
            return y
        return forward

    # (a) one step's gradients and loss against the single-device twin
    # (unmeasured; it also opens gloo's pairs before the measured run)
    model = make_stage(doc, p, r)
    comm = P2P(p, r, (B, T, D))
    run_schedule(comm, m, sched, forward_of(model, 0, False))
    sent = comm.sent
    refp, ref_loss = reference_step(doc, pool, m)
    worst, worst_name = grad_error([model], refp)
    got_loss = sum(losses) if r == p - 1 else None
    del model, refp
    losses.clear()
    # (b) the live bytes of STEPS steps, from building the stage on
    tw.BWD_MARK[0] = bwd_mark
    saved_rf = torch.autograd.profiler.record_function
    torch.autograd.profiler.record_function = lb.QuietRange
    info = {}
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            with Mark("setup"):
                model = make_stage(doc, p, r)
                opt = torch.optim.AdamW(model.parameters(), foreach=True)
                comm = P2P(p, r, (B, T, D))
            for step in range(STEPS):
                with Mark("iter%d" % step):
                    run_schedule(comm, m, sched,
                                 forward_of(model, step, step == STEPS - 1))
                    info["grads"] = [q.grad.data_ptr() for q in model.parameters()]
                    with Mark("step"):
                        opt.step()
                    with Mark("zero_grad"):
                        opt.zero_grad(set_to_none=True)
            info["params"] = [q.data_ptr() for q in model.parameters()]
            info["states"] = [v.data_ptr() for st in opt.state.values()
                              for k, v in st.items() if torch.is_tensor(v) and k != "step"]
            with Mark("teardown"):
                del model, opt
                gc.collect()
    finally:
        torch.autograd.profiler.record_function = saved_rf
        tw.BWD_MARK[0] = None
    info["batch"] = batch_ptrs
    an = analyse(lb.Curve(prof), info, r == p - 1)
    an.update({"sched": sched, "m": m, "grad_err": worst, "grad_worst": worst_name,
               "loss": got_loss, "ref_loss": ref_loss, "sent": sent,
               "seconds": time.time() - t0})
    return an


def bwd_mark(name):
    """A block's backward starts (twins.py's bwd_mark hook): a mark."""
    with Mark("bwd:" + name):
        pass


def analyse(c, info, last):
    """The steady step's device-view peak, where it falls, and what is alive
    there by origin; the step's (optimizer's) maximum."""
    view, kind = c.device_view()
    # when each tagged artefact (1.13's x^2) leaves the device view
    tag_at = {}
    for s, _, n in c.marks:
        if n.startswith("tag:"):
            ptr = int(n.split(":")[2])
            j = bisect.bisect_left(c.times, s) - 1
            while j >= 0 and not (c.ev[j]["ptr"] == ptr and c.ev[j]["d"] > 0):
                j -= 1
            tag_at[j] = s
    it = "iter%d" % (STEPS - 1)
    s0, e0 = c.range(it)
    k0, k1 = bisect.bisect_left(c.times, s0), bisect.bisect_left(c.times, e0)
    ss, se = [(s, e) for s, e, n in c.marks if n == "step" and s0 <= s <= e0][0]
    raw = [e["d"] for e in c.ev]
    raw_peak = max(list(itertools.accumulate(raw[:k1], initial=0))[k0:])
    live = sum(view[:k0])
    start, best, at, step_max, fwd_max = live, live, k0 - 1, 0, 0
    for k in range(k0, k1):
        live += view[k]
        if view[k] and live > best:
            best, at = live, k
        if ss <= c.times[k] <= se:
            step_max = max(step_max, live)
        # the forwards' maximum: events whose innermost micro-batch range
        # is a forward's (F<i>)
        fbk = [a[3:] for a in c.ev[k]["anc"] if a.startswith("ml:") and a[3:4] in "FB"
               and a[4:].isdigit()]
        if view[k] and fbk and fbk[-1][0] == "F":
            fwd_max = max(fwd_max, live)
    ev = c.ev[at]
    t = ev["t"]
    marks = [a[3:] for a in ev["anc"] if a.startswith("ml:")]
    fb = [x for x in marks if x[:1] in "FB" and x[1:].isdigit()]
    ops = [a for a in ev["anc"] if a.startswith("aten::") and a not in lb.EMPTY]
    # the block whose backward runs: the last bwd mark since this backward's
    # range opened (none yet: the loss's)
    blk = ""
    if fb and fb[-1][0] == "B":
        rs = max(s for s, e, n in c.marks if n == fb[-1] and s0 <= s <= t)
        bw = [n[4:] for s, _, n in c.marks if rs <= s <= t and n.startswith("bwd:")]
        blk = bw[-1] if bw else ("loss" if last else "receive")
    # the live bytes' maximum in each block of the peak's backward (the
    # backward_step's range: the last of its ranges to open before the peak)
    bmax = {}
    if blk:
        rs, re = max((s, e) for s, e, n in c.marks if n == fb[-1] and s0 <= s <= t)
        bm = sorted((s, n[4:]) for s, _, n in c.marks if rs <= s <= re and n.startswith("bwd:"))
        bt = [x[0] for x in bm]
        kk = bisect.bisect_left(c.times, rs)
        live = sum(view[:kk])
        while kk < len(c.ev) and c.times[kk] <= re:
            live += view[kk]
            i = bisect.bisect_right(bt, c.times[kk]) - 1
            name = bm[i][1] if i >= 0 else ("loss" if last else "receive")
            bmax[name] = max(bmax.get(name, 0), live)
            kk += 1
    # the gradients: the allocations alive when the step starts at their pointers
    ks = bisect.bisect_left(c.times, ss)
    gptr = set(info["grads"])
    grads = {i for i in range(ks) if c.ev[i]["d"] > 0 and c.ev[i]["ptr"] in gptr
             and (c.ev[i]["free"] is None or c.ev[i]["free"] >= ks)}
    params, states, batch = set(info["params"]), set(info["states"]), set(info["batch"])
    led = {}
    for i in range(at + 1):
        e = c.ev[i]
        if e["d"] <= 0 or (e["free"] is not None and e["free"] <= at):
            continue
        if kind[i] is not None and (i not in tag_at or tag_at[i] <= t):
            continue  # a CPU artefact, out of the device view by then
        ms = [a[3:] for a in e["anc"] if a.startswith("ml:")]
        mb = [x for x in ms if x[:1] in "FB" and x[1:].isdigit()]
        if "setup" in ms:
            key = "params" if e["ptr"] in params else "buffers"
        elif e["ptr"] in states and "iter0" in ms:
            key = "optimizer_states"
        elif i in grads:
            key = "grads"
        elif it in ms and mb and mb[-1][0] == "F" and e["ptr"] in batch:
            key = "batch:" + mb[-1]
        elif it in ms and mb:
            key = mb[-1]
        else:
            key = "other:" + "/".join(ms)
        led[key] = led.get(key, 0) + e["d"]
    return {"errors": c.errors[:5], "leaked": c.leaked, "start": start, "peak": best,
            "peak_at": fb[-1] if fb else "", "op": ops[-1] if ops else "", "block": blk,
            "ledger": led, "step_max": step_max, "fwd_max": fwd_max, "bwd_max": bmax,
            "raw_peak": raw_peak}


def run_world(p, jobs, main=None):
    """Spawns p stages, each main(rank, p, init_file, out_dir, jobs) (this
    file's rank_main by default); returns each stage's results."""
    with tempfile.TemporaryDirectory(prefix="pp_twins.") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        mp.start_processes(main or rank_main, args=(p, init_file, tmp, jobs), nprocs=p,
                           join=True, start_method="spawn")
        out = []
        for r in range(p):
            with open(os.path.join(tmp, "rank%d.json" % r)) as fh:
                out.append(json.load(fh))
        return out


# --------------------------------------------------------------------------
# The hand derivation (the docstring's, as formulas)

class Model:
    """A model file's sizes and the derivation's figures for its stages."""

    def __init__(s, doc):
        m, tr = doc["model"], doc.get("training", {})
        s.m, s.L = m, m["layers"]
        s.B, s.T, s.D, s.F, s.V = tr.get("micro_batch", 2), tr.get("seq_len", 16), \
            m["hidden"], m["ffn"], m["vocab"]
        # the peak's candidates are derived for the docstring's sizes; a
        # longer sequence moves it into the attention (below)
        s.by_hand = (s.B, s.T, s.D, s.F, s.V) == (2, 24, 64, 160, 173)
        s.dh = m.get("head_dim", m["hidden"] // m["heads"])
        s.BTD, s.BTF, s.BTV = 4 * s.B * s.T * s.D, 4 * s.B * s.T * s.F, 4 * s.B * s.T * s.V
        s.DF = 4 * s.D * s.F
        s.tables = 2 * s.T * s.dh * 4  # cos and sin, one row for the batch
        s.tok = s.B * s.T * 8
        s.layer = hand_layer(m, s.B, s.T, 1, False)  # (1.13, planned)
        s.head = (4 * (4 * s.B * s.T * s.D + s.B * s.T), 4 * (3 * s.B * s.T * s.D + s.B * s.T))
        s.loss = (s.BTV + 4 + 8, s.BTV + 4)
        # parameters (elements): a layer's, the embedding's = the head's, a norm's
        D, H, KV, F_ = s.D, m["heads"], m.get("kv_heads", m["heads"]), s.F
        s.p_layer = D * H * s.dh * 2 + D * KV * s.dh * 2 + 3 * D * F_ + 2 * D
        s.p_embed = s.V * D

    def blocks(s, p, r):
        """{block: (1.13 bytes, planned bytes)} for one micro-batch on stage r."""
        a, b = stage_range(s.L, p, r)
        out = {("embedding" if r == 0 else "rotary"): (s.tables, s.tables)}
        for i in range(a, b):
            out["block.%d" % i] = s.layer
        if r == p - 1:
            out["head"], out["loss"] = s.head, s.loss
        return out

    def saved(s, p, r):
        return sum(v[1] for v in s.blocks(p, r).values())

    def hold(s, p, r):
        """H_r: one held micro-batch, its batch tensors with it."""
        return s.saved(p, r) + s.tok * ((r == 0) + (r == p - 1))

    def params(s, p, r):
        a, b = stage_range(s.L, p, r)
        return (b - a) * s.p_layer + (s.p_embed if r == 0 else 0) \
            + (s.p_embed + s.D if r == p - 1 else 0)

    def sent(s, p, r, m):
        """Bytes the stage sends in a step: activations forward, gradients back."""
        return m * s.BTD * ((r < p - 1) + (r > 0))

    def peak(s, p, r, m, sched):
        """The two candidates: {"first"|"later": (bytes, k, backward, op, parts)},
        parts naming what each is made of."""
        P = 4 * s.params(p, r)
        R = 3 * P + 4 * s.dh // 2
        H = s.hold(p, r)
        order = schedule_order(p, r, m, sched)
        k = []  # micro-batches in flight at each backward's start
        f = 0
        for kind, i in order:
            if kind == "F":
                f += 1
            else:
                k.append(f - i)
        last = r == p - 1
        out = {}
        if not last:
            out["first"] = (k[0], "B0", "aten::mul", s.last_block(p, r), {
                "resident (params, states, buffers)": R, "held": k[0] * H,
                "gradients so far (down_proj's)": s.DF, "received gradient": s.BTD,
                "SwiGLU mul's operand gradients and the product's": 3 * s.BTF,
                "the product (down_proj's input) freed": -s.BTF})
            if m > 1:
                out["later"] = (k[1], "B1", "aten::mm", s.last_block(p, r), {
                    "resident (params, states, buffers)": R, "gradients": P,
                    "held": k[1] * H, "previous input gradient": s.BTD * (r > 0),
                    "received gradient": s.BTD, "down_proj's input gradient": s.BTF,
                    "down_proj's weight gradient": s.DF})
        else:
            out["first"] = (k[0], "B0", "aten::mul", s.last_block(p, r), {
                "resident (params, states, buffers)": R, "held": k[0] * H,
                "gradients so far (head, final norm, down_proj)": 4 * (s.p_embed + s.D) + s.DF,
                "loss, labels, head and product freed": -(s.loss[1] + s.tok + s.head[1] + s.BTF),
                "the final norm's input gradient": s.BTD,
                "SwiGLU mul's operand gradients and the product's": 3 * s.BTF,
                "seed and the loss's gradient": 8})
            if m > 1:
                out["later"] = (k[1], "B1", "aten::_log_softmax_backward_data", "loss", {
                    "resident (params, states, buffers)": R, "gradients": P,
                    "held": k[1] * H, "previous input gradient": s.BTD * (p > 1),
                    "labels and total_weight freed": -(s.tok + 4),
                    "nll_loss's and log-softmax's gradients": 2 * s.BTV,
                    "seed and the loss's gradient": 8})
        return {w: (sum(v[4].values()),) + v for w, v in out.items()}

    def last_block(s, p, r):
        return "block.%d" % (stage_range(s.L, p, r)[1] - 1)

    def step_max(s, p, r):
        """The optimizer step's maximum: resident, the gradients and foreach
        AdamW's square roots of exp_avg_sq (P each; 1.13's second
        denominator is outside the device view), and the 0-dim double
        _foreach_div_ wraps the bias correction in (8 B, made inside
        aten::div_, so the device view keeps it: host memory on a GPU)."""
        P = 4 * s.params(p, r)
        return 3 * P + 4 * s.dh // 2 + 2 * P + 8


def hand_table(doc):
    """The docstring's table, from the formulas."""
    s = Model(doc)
    rows = []
    for p in P_SIZES:
        if s.L % p:
            continue
        for r in range(p):
            P = 4 * s.params(p, r)
            for sched, m in CONFIGS:
                c = s.peak(p, r, m, sched)
                w = max(c, key=lambda x: c[x][0])
                rows.append("  %d %d %-5s %d  %9s  %d %10s  %s %10s  %10s  %s %s" % (
                    p, r, sched, m, "{:,}".format(3 * P + 16), c["first"][1],
                    "{:,}".format(c["first"][0]), c["later"][1] if "later" in c else "-",
                    "{:,}".format(c["later"][0]) if "later" in c else "-",
                    "{:,}".format(c[w][0]), c[w][2], c[w][3]))
    return rows


# --------------------------------------------------------------------------
# The plan

def plan(memledger, path, p, sched, m, B, T):
    args = [memledger, "plan", path, "--format", "json", "--pp", str(p), "--pp-schedule", sched,
            "--micro-batches", str(m), "--allocator", "none", "--micro-batch", str(B),
            "--seq-len", str(T), "--precision", "fp32", "--checkpoint", "none",
            "--optimizer", "adamw", "--optimizer-impl", "foreach", "--logits", "released"]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode not in (0, 1):
        return None, "%s exited %d: %s" % (" ".join(args[1:]), out.returncode,
                                            out.stderr.strip()[:300])
    try:
        return json.loads(out.stdout), ""
    except ValueError as e:
        return None, "%s: output not JSON (%s)" % (" ".join(args[1:]), e)


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    t_start = time.time()
    memledger, models = sys.argv[1], sys.argv[2]
    files = sorted(os.path.join(models, f) for f in os.listdir(models) if f.endswith(".yaml"))
    check = tw.Checks()

    def info(name, ok, detail):
        """A hand candidate where the derivation does not reach: printed."""
        print("INFO %s (%s): %s" % (name, "as derived" if ok else "not derived", detail))

    def fmt(n):
        return "{:,}".format(n)

    docs = {}
    for path in files:
        with open(path) as fh:
            docs[path] = tw.load(fh)
    for path, doc in docs.items():
        if not Model(doc).by_hand:
            continue
        print("hand derivation, %s:\n  p r sched m   R          k  first       k  later"
              "       peak" % doc["name"])
        print("\n".join(hand_table(doc)))

    for p in P_SIZES:
        jobs = [path for path, doc in docs.items() if doc["model"]["layers"] % p == 0]
        for path in set(docs) - set(jobs):
            print("skip %s at p %d: %d layers" % (docs[path]["name"], p,
                                                  docs[path]["model"]["layers"]))
        if not jobs:
            continue
        t0 = time.time()
        try:
            ranks = run_world(p, jobs)
        except Exception as e:  # a stage raised: its traceback is on stderr
            check("p%d stages" % p, False, "%s: %s" % (type(e).__name__, e))
            continue
        print("p %d: %d stages over gloo, %.1f s" % (p, p, time.time() - t0))
        for j, path in enumerate(jobs):
            doc = docs[path]
            s = Model(doc)
            extra = xc.known_1_13(doc, s.B, s.T)
            extra["loss"] = 8  # loss /= m: the Python int, a 0-dim double
            # (1) one micro-batch's saved bytes per stage
            planned_saved = {}
            for r in range(p):
                got = ranks[r][j]["saved"]
                lbl = "%s p%d stage %d" % (doc["name"], p, r)
                check(lbl + " params", got["params"] == s.params(p, r),
                      "twin %s, by hand %s" % (fmt(got["params"]), fmt(s.params(p, r))))
                want = s.blocks(p, r)
                for blk in sorted(set(want) | set(got["blocks"])):
                    g, w = got["blocks"].get(blk, 0), want.get(blk, (0, 0))[0]
                    check("%s %s saved" % (lbl, blk), g == w,
                          "measured %s, by hand %s" % (fmt(g), fmt(w)))
                planned_saved[r] = {b: v - extra.get(b, 0) for b, v in got["blocks"].items()}
                tot = sum(planned_saved[r].values())
                check(lbl + " saved less the 1.13 artefacts", tot == s.saved(p, r),
                      "measured %s - %s = %s, by hand %s" % (
                          fmt(sum(got["blocks"].values())),
                          fmt(sum(got["blocks"].values()) - tot), fmt(tot), fmt(s.saved(p, r))))
            # (2) each schedule
            for c, (sched, m) in enumerate(CONFIGS):
                label = "%s p%d %s m%d" % (doc["name"], p, sched, m)
                meas = [ranks[r][j]["configs"][c] for r in range(p)]
                for r, res in enumerate(meas):
                    lbl = "%s stage %d" % (label, r)
                    ok = res["grad_err"] <= 1e-5
                    if r == p - 1:
                        gap = abs(res["loss"] - res["ref_loss"])
                        ok = ok and gap <= 1e-6 * abs(res["ref_loss"])
                    check(lbl + " matches single device", ok,
                          "largest gradient gap %.1e (%s)%s" % (
                              res["grad_err"], res["grad_worst"],
                              ", loss %.7f vs %.7f" % (res["loss"], res["ref_loss"])
                              if r == p - 1 else ""))
                    check(lbl + " bytes sent", res["sent"] == s.sent(p, r, m),
                          "%s, by hand %s" % (fmt(res["sent"]), fmt(s.sent(p, r, m))))
                    check(lbl + " live-bytes oracle", not res["errors"] and not res["leaked"],
                          "errors %s, left after teardown %d B" % (res["errors"], res["leaked"]))
                    cand = s.peak(p, r, m, sched)
                    win = max(cand, key=lambda x: cand[x][0])
                    hp, k, bi, op, blk, parts = cand[win]
                    led = res["ledger"]
                    # (a longer sequence's peak: held against the plan only, (3))
                    peak_check = check if s.by_hand else info
                    peak_check(lbl + " peak", res["peak"] == hp,
                               "measured %s (raw CPU %s), by hand %s (%s backward: %s)" % (
                                   fmt(res["peak"]), fmt(res["raw_peak"]), fmt(hp), win,
                                   ", ".join("%s %s" % (n, fmt(v)) for n, v in parts.items() if v)))
                    peak_check(lbl + " peak's place",
                               (res["peak_at"], res["op"], res["block"]) == (bi, op, blk),
                               "measured %s %s in %s's backward, by hand %s %s in %s's" % (
                                   res["peak_at"], res["op"], res["block"], bi, op, blk))
                    held = sorted(int(x[1:]) for x in led if x[:1] == "F")
                    fwd = {i: led.get("F%d" % i, 0) + led.get("batch:F%d" % i, 0) for i in held}
                    brief = min(m, p - r) if sched == "1f1b" else m
                    peak_check(lbl + " in flight at the peak", (len(held), len(held)) == (k, brief),
                               "forwards alive %s, by hand %d (%s)" % (
                                   ["F%d" % i for i in held], brief,
                                   "min(m, p - r)" if sched == "1f1b" else "m"))
                    full = [i for i in held if "B%d" % i != res["peak_at"]]
                    check(lbl + " each held micro-batch", all(fwd[i] == s.hold(p, r) for i in full),
                          "%s, by hand H = %s" % (
                              ", ".join("F%d %s%s" % (i, fmt(fwd[i]), "" if i in full else
                                                      " (in its backward)") for i in held),
                              fmt(s.hold(p, r))))
                    peak_check(lbl + " ledger sums to the peak", sum(led.values()) == res["peak"],
                               ", ".join("%s %s" % (n, fmt(v)) for n, v in sorted(led.items())))
                    check(lbl + " optimizer step's maximum",
                          res["step_max"] == s.step_max(p, r) and res["step_max"] < res["peak"],
                          "measured %s, by hand %s (R + 2P + 8), under the peak %s" % (
                              fmt(res["step_max"]), fmt(s.step_max(p, r)), fmt(res["peak"])))
                # (3) the plan
                j_plan, why = plan(memledger, path, p, sched, m, s.B, s.T)
                if j_plan is None or not j_plan.get("ranks"):
                    check(label + " plan", False, why or "no ranks in the plan's JSON")
                    for r in range(p):
                        for what in ("layers", "params", "in_flight", "activations_saved",
                                     "p2p_bytes", "peak"):
                            check("%s stage %d planned %s" % (label, r, what), False,
                                  "no plan to compare")
                    check(label + " planned worst_rank", False, "no plan to compare")
                    continue
                pr = j_plan["ranks"]
                check(label + " planned stages", len(pr) == p, "%d, expected %d" % (len(pr), p))
                for r, res in enumerate(meas[:len(pr)]):
                    lbl = "%s stage %d planned" % (label, r)
                    q = pr[r]
                    cand = s.peak(p, r, m, sched)
                    win = max(cand, key=lambda x: cand[x][0])
                    hp, k = cand[win][:2]
                    if not s.by_hand:  # the measured peak's backward
                        k = next(c[1] for c in cand.values() if c[2] == res["peak_at"])
                    check(lbl + " layers", q.get("layers") == list(stage_range(s.L, p, r)),
                          "%s, expected %s" % (q.get("layers"), list(stage_range(s.L, p, r))))
                    check(lbl + " params", q.get("params") == s.params(p, r),
                          "%s, twin %s" % (q.get("params"), fmt(s.params(p, r))))
                    check(lbl + " in_flight", q.get("in_flight") == k,
                          "%s, measured %d" % (q.get("in_flight"), k))
                    ms = sum(planned_saved[r].values())
                    qs = q.get("activations_saved")
                    tip = ""
                    if qs is not None and qs != ms:
                        tip = tw.explain(ms - qs, {
                            "the stage's own rotary tables (2*T*dh*4)":
                                s.tables if r > 0 else 0}) or ""
                        tip = "; the plan lacks " + tip if tip else ""
                    check(lbl + " activations_saved", qs == ms,
                          "%s, measured less the 1.13 artefacts %s%s" % (
                              fmt(qs) if qs is not None else None, fmt(ms), tip))
                    check(lbl + " p2p_bytes", q.get("p2p_bytes") == res["sent"],
                          "%s, measured %s" % (q.get("p2p_bytes"), fmt(res["sent"])))
                    qp = q.get("peak")
                    if qp is None:
                        check(lbl + " peak", False, "no peak")
                        continue
                    d = qp - res["peak"]
                    ok = abs(d) <= TOL * res["peak"]
                    detail = "planned %s, measured %s, difference %+d (%+.2f%%)" % (
                        fmt(qp), fmt(res["peak"]), d, 100.0 * d / res["peak"])
                    if d:
                        why, named = made_of(s, p, r, m, sched, d, res, cand, win, q,
                                             j_plan if j_plan.get("worst_rank") == r else None)
                        detail += "; " + why
                        # within 1 %, and every byte of it named
                        ok = ok and named
                    check(lbl + " peak", ok, detail)
                worst = max(range(p), key=lambda r: (meas[r]["peak"], -r))
                check(label + " planned worst_rank", j_plan.get("worst_rank") == worst,
                      "%s, measured %d (peaks %s)" % (j_plan.get("worst_rank"), worst,
                                                      ", ".join(fmt(x["peak"]) for x in meas)))
                w = j_plan.get("worst_rank")
                if isinstance(w, int) and 0 <= w < p:
                    # the fullest stage's forwards (the loss, computed in the last
                    # stage's forward_step, among them): in 1F1B's steady state the
                    # previous micro-batch's received gradient is alive through
                    # them (output_tensor_grad, rebound by the next receive)
                    # (on the last stage that maximum is at nll_loss, beside the
                    # logits: its 0-dim output, 4 B, which the plan leaves out, as
                    # livebytes.py's amp_checks name it)
                    ph = j_plan.get("peaks", {}).get("phases", {}).get("steady", {})
                    qf = max([(ph.get(x) or {}).get("peak") or 0 for x in ("forward", "loss")])
                    mf = meas[w]["fwd_max"] - (4 if w == p - 1 else 0)
                    check("%s stage %d planned forward" % (label, w), qf == mf,
                          "planned %s (forward and loss), measured %s%s, difference %+d" % (
                              fmt(qf), fmt(mf), " less the loss's 4 B" if w == p - 1 else "",
                              qf - mf))
                    # the fullest stage's optimizer step: the phase's peak
                    qo = j_plan.get("peaks", {}).get("phases", {}).get("steady", {}) \
                        .get("optimizer", {}).get("peak")
                    mo = meas[w]["step_max"]
                    check("%s stage %d planned optimizer step" % (label, w),
                          qo is not None and abs(qo - mo) <= TOL * mo,
                          "planned %s, measured %s, difference %s (the twin's batch "
                          "tensors die with their backward; its 8 B is a host scalar)" % (
                              fmt(qo) if qo is not None else None, fmt(mo),
                              "%+d" % (qo - mo) if qo is not None else "-"))
                    got = {b["name"]: b["activations_saved"] for b in j_plan.get("blocks", [])}
                    for blk in sorted(set(got) | set(planned_saved[w])):
                        g, want = got.get(blk), planned_saved[w].get(blk, 0)
                        check("%s stage %d block %s planned" % (label, w, blk),
                              (g or 0) == want,
                              "%s, measured less the 1.13 artefacts %s" % (g, fmt(want)))
    print("%.1f s" % (time.time() - t_start))
    return check.done(models)


def made_of(s, p, r, m, sched, d, res, cand, win, q, j_plan):
    """What plan - measured = d is made of, in the derivation's items."""
    out = []
    led = res["ledger"]
    if j_plan is not None:
        # the fullest stage: the plan's breakdown against the measured one
        bd = j_plan.get("peak", {}).get("breakdown", {})
        mine = {"params": led.get("params", 0), "grads": led.get("grads", 0),
                "optimizer_states": led.get("optimizer_states", 0),
                "buffers": led.get("buffers", 0),
                "batch": sum(v for n, v in led.items() if n.startswith("batch:")),
                "activations_saved": sum(v for n, v in led.items() if n[:1] == "F"),
                "workspace": sum(v for n, v in led.items() if n[:1] == "B" or
                                 n.startswith("other"))}
        out.append("the plan's breakdown (at %s %s) - measured: %s" % (
            j_plan.get("peak", {}).get("phase"), j_plan.get("peak", {}).get("step"),
            ", ".join("%s %+d" % (n, bd.get(n, 0) - v) for n, v in mine.items()
                      if bd.get(n, 0) != v)))
    # known from the plan itself: the held micro-batches' saved bytes
    k = cand[win][1]
    fixed = k * (q.get("activations_saved", 0) - s.saved(p, r))
    # the derivation's items a plan may lack or hold otherwise
    items = {}
    if win == "later" and r > 0:
        items["previous input gradient (the schedule's input_tensor_grad)"] = -s.BTD
    if r == 0 or r == p - 1:
        items["batch tensors of the other held micro-batches"] = -(k - 1) * s.tok
    if r == p - 1:
        items["the seed and the loss's gradient"] = -8
        # the plan frees a micro-batch's targets with its batch, when its
        # backward ends; nll_loss saved them, and its node releases them
        # (with total_weight) before the log-softmax's backward runs
        items["this micro-batch's labels, which NllLossBackward0 releases"] = s.tok
        if res["op"] == "aten::_log_softmax_backward_data":
            items["nll_loss's total_weight, released by its node (the plan: with the " +
                  "loss's saved tensors, after the block)"] = 4
    if win == "first" and "later" in cand:
        # the later backward's form (every gradient resident) with the
        # first's k micro-batches held, against the first's
        other = dict(cand["later"][5])
        other["held"] = k * s.hold(p, r)
        items["gradients the step's first backward has not made yet, and the later " +
              "backward's op"] = (sum(other.values()) - cand[win][0] -
                                  (s.BTD if r > 0 else 0) - (8 if r == p - 1 else 0))
    head = "held micro-batches' saved bytes as planned %+d" % fixed if fixed else ""
    e = tw.explain(d - fixed, items) if d != fixed else ""
    if e is not None:
        out.append("made of: " + " + ".join(x for x in (head, e) if x))
    else:
        out.append("made of: %sa remainder %+d, none of: %s" % (
            head + " and " if head else "", d - fixed,
            ", ".join("%s %+d" % kv for kv in items.items())))
    out.append("measured at the peak: " + ", ".join(
        "%s %d" % (n, v) for n, v in sorted(led.items())))
    if res.get("bwd_max"):
        out.append("measured maxima in %s's blocks: %s" % (res["peak_at"], ", ".join(
            "%s %d" % kv for kv in res["bwd_max"].items())))
    return "; ".join(out), e is not None


if __name__ == "__main__":
    sys.exit(main())
