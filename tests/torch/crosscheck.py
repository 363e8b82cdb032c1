#!/usr/bin/python3
"""Cross-check memledger's activation inventory against real PyTorch autograd.

For each model YAML under tests/torch/models/, this builds the same network in
PyTorch from the YAML's fields (the reference implementations of
docs/inventory.md, written out below), runs one training iteration on random
data, and measures with torch.autograd.graph.saved_tensors_hooks:
  - the bytes saved for backward, each storage counted once, parameters and
    buffers excluded, in total and per block (the block running when saved);
  - the parameter count and the optimizer state bytes after one step();
  - with torch.utils.checkpoint around the blocks, the bytes saved at the end
    of forward.
It compares them with `memledger plan --format json` for the same file and
configuration. Known differences between PyTorch 1.13 (Debian's, on the CPU)
and the 2.x/CUDA behaviour the planner models are accounted explicitly (see
KNOWN below and docs/validation.md); everything else must agree within 1%.

usage: crosscheck.py MEMLEDGER MODELS_DIR [--doc OUT.md]
Prints one line per check and ends with "N passed, N failed".
"""
import json
import math
import subprocess
import sys

import os

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from twins import (  # noqa: E402  (the reference implementations: twins.py)
    INPLACE, F, GemmaRMSNorm, RMSNorm, batch_for, build, load, seq_layers, target_len)
from twins_llava import image_tokens  # noqa: E402

TOL = 0.01
# amp-bf16 through CPU autocast; its differences from CUDA autocast that
# these models meet are accounted in known_cpu_autocast().
AMP_MODELS = {"xc-gpt2-rope", "xc-gpt2-rope-flash", "xc-phi3-flash", "xc-neox-flash", "xc-llama-flash", "xc-mlp", "xc-gpt2", "xc-gpt2-nodrop", "xc-llama", "xc-gemma", "xc-gemma2",
              "xc-bert", "xc-phi3", "xc-bert-mlm", "xc-falcon", "xc-falcon-mha", "xc-mixtral", "xc-llama-cls", "xc-qwen2moe", "xc-neox",
              "xc-deepseek", "xc-deepseek2", "xc-vit", "xc-t5", "xc-t5-gated",
              "xc-llava", "xc-llava-frozen", "xc-llava-none", "xc-llava-full",
              "xc-llama-b1", "xc-falcon-b1", "xc-neox-b1", "xc-bert-b1", "xc-gemma-b1",
              "xc-gpt2-gelunew", "xc-gpt2-b1", "xc-olmo-b1", "xc-vit-b1"}
# Checked byte for byte (the others within TOL): a Gemma block's 1 + weight
# vectors are 0.15 % of it, under the 1 % tolerance; Phi-3's fused
# projections, BERT's MLM head, Gemma 2's post norms and soft-caps, Falcon's
# shared-norm parallel layer, Mixtral's experts and the decoders'
# sequence-classification head are new layouts, held to every byte (so are
# Llava's vision tower, projector and merged sequence).
EXACT_MODELS = {"xc-gpt2-rope", "xc-gpt2-rope-flash", "xc-phi3-flash", "xc-neox-flash", "xc-llama-flash", "xc-gemma", "xc-gemma2", "xc-phi3", "xc-bert-mlm", "xc-falcon", "xc-falcon-mha", "xc-mixtral", "xc-llama-cls", "xc-qwen2moe", "xc-neox", "xc-vit", "xc-t5", "xc-t5-gated",
                "xc-deepseek", "xc-deepseek2", "xc-llava", "xc-llava-frozen", "xc-llava-none", "xc-llava-full",
                "xc-llama-b1", "xc-falcon-b1", "xc-neox-b1", "xc-bert-b1", "xc-gemma-b1",
                "xc-gpt2-gelunew", "xc-vit-b1"}
torch.manual_seed(0)


# --------------------------------------------------------------------------
# Measurement

class Recorder:
    """Counts saved storages once, attributing each to the current block."""

    def __init__(self, model):
        self.exclude = set()
        for t in list(model.parameters()) + list(model.buffers()):
            self.exclude.add(t.storage().data_ptr())
        self.seen = {}
        # the storages counted, held until the recorder goes: a saved tensor
        # freed during forward (what Llava's unused vision layers save dies
        # when get_image_features returns) must not lend its address to a
        # later one, which `seen` would then skip
        self.keep = []
        self.block = "?"
        self.pinned = {}  # storage ptr -> block, for tensors attributed by origin

    def pack(self, t):
        if t.numel() == 0:
            return t
        st = t.storage()
        ptr = st.data_ptr()
        if ptr in self.exclude or ptr in self.seen:
            return t
        self.seen[ptr] = (st.nbytes(), self.pinned.get(ptr, self.block))
        self.keep.append(st)
        return t

    def per_block(self):
        out = {}
        for nbytes, blk in self.seen.values():
            out[blk] = out.get(blk, 0) + nbytes
        return out

    def total(self):
        return sum(n for n, _ in self.seen.values())


# --------------------------------------------------------------------------
# Known differences between PyTorch 1.13 on the CPU and the planner's model
# of 2.x eager autograd: each adds bytes the 1.13 run saves and 2.x does not.

def known_1_13_t5(doc, B, T):
    """T5's 1.13 extras: each T5LayerNorm's x^2 (mean's input, fp32), two
    per encoder block, three per decoder block, one in the encoder's final
    norm and in the head; and the tied head's rescale by d_model ** -0.5, a
    Python float saved as a 0-dim double (host memory on a GPU). T5 scales
    no attention scores: no per-block scalar."""
    m = doc["model"]
    Td = target_len(doc, T)
    xs, xd = B * T * m["hidden"] * 4, B * Td * m["hidden"] * 4
    # gelu_new's three Python floats (0.5, sqrt(2/pi), 0.044715) are 0-dim
    # doubles its muls save: host memory on a GPU
    g = 24 if m.get("activation") == "geglu" else 0
    extra = {"encoder.block.%d" % i: 2 * xs + g for i in range(m["layers"])}
    for i in range(m.get("decoder_layers", m["layers"])):
        extra["decoder.block.%d" % i] = 3 * xd + g
    extra["encoder.final"] = xs
    extra["head"] = xd + (8 if m.get("tied_embeddings", True) else 0)
    return extra


def clip_host_scalars(doc):
    """Each CLIP vision layer's 1.13 host scalars (known_1_13_llava)."""
    v = doc["model"]["stacks"]["vision"]
    per = 8 + (8 if v.get("activation", "quick_gelu") == "quick_gelu" else 0)
    return {"vision.layer.%d" % i: per for i in range(v["layers"])}


def known_1_13_llava(doc, B, T):
    """Llava's 1.13 extras (twins_llava.py). The Llama decoder's, under the
    keys a decoder has: each block's two RMSNorm x^2 (mean's input, fp32,
    B*T*D*4 each, T the merged sequence) and its attention scale, a Python
    float saved as a 0-dim double (8 B, host memory on a GPU); the head's
    final-norm x^2. Each CLIP vision layer (the unused last one too) has two
    host scalars: its attention scale (`* scale`) and quick_gelu's 1.702
    (`1.702 * x`: mul keeps the Python float as a 0-dim double for x's
    gradient), 8 B each. The vision embedding (a bias-free conv, cat, the
    position embedding, LayerNorm), post_layernorm and the projector (Linear,
    exact GELU, masked_scatter) save nothing 2.x does not."""
    d = doc["model"]["stacks"]["decoder"]
    x2 = B * T * d["hidden"] * 4
    extra = {"block.%d" % i: 2 * x2 + 8 for i in range(d["layers"])}
    extra["head"] = x2
    extra.update(clip_host_scalars(doc))
    return extra


def projector_keeps_hidden(doc, B, amp):
    """Whether Llava's linear_1 keeps the feature layer's whole hidden
    state (fp32, B*Tv*Dv*4): its input is a view of it with
    feature_select full, or with one image (the slice's reshape to
    (tokens, width) for the matmul is a view when the batch is one); under
    autocast it keeps its cast copy instead. That storage is the first
    unused layer's input: the plan keeps it once, in activations_saved."""
    v = doc["model"]["stacks"]["vision"]
    return not amp and (v.get("feature_select") == "full" or B == 1)


def hidden_bytes(doc, B):
    """One hidden state of Llava's vision tower, fp32: B*Tv*Dv*4."""
    v = doc["model"]["stacks"]["vision"]
    g = v["image_size"] // v["patch_size"]
    return B * (g * g + 1) * v["hidden"] * 4


def unused_checkpointed(doc, B, amp=False):
    """What a checkpointed unused vision layer (past Llava's
    vision_feature_layer) packs, though nothing keeps it for the backward:
    the checkpoint's input (the previous layer's output, fp32 B*Tv*Dv*4),
    and for the tower's last layer post_layernorm's input (the layer's
    output) and statistics (2*B*4). All die when get_image_features
    returns; the plan's activations_saved, what the backward keeps, has
    none of it (docs/inventory.md, "Llava") but the first unused layer's
    input where the projector keeps it (projector_keeps_hidden)."""
    v = doc["model"]["stacks"]["vision"]
    x = hidden_bytes(doc, B)
    L = v["layers"]
    at = L + 1 + v.get("feature_layer", -2) if v.get("feature_layer", -2) < 0 else v["feature_layer"]
    out = {"vision.layer.%d" % i: x for i in range(at, L)}
    if at < L and projector_keeps_hidden(doc, B, amp):
        out["vision.layer.%d" % at] -= x
    if at < L:
        out["vision.layer.%d" % (L - 1)] += x + 2 * B * 4
    return out


def known_1_13(doc, B, T):
    """Per-block extra bytes a 1.13 CPU run saves (docs/validation.md)."""
    m = doc["model"]
    if m["type"] == "encoder-decoder":
        return known_1_13_t5(doc, B, T)
    if m["type"] == "multimodal":
        return known_1_13_llava(doc, B, T)
    extra = {}
    if m["type"] != "sequential" and m.get("norm") in ("rmsnorm", "gemma_rmsnorm"):
        # 1.13's mean backward keeps its input: RMSNorm's x^2, fp32, B*T*D
        x2 = B * T * m["hidden"] * 4
        norms = 4 if m.get("post_norms") else 2  # Gemma 2: four per layer
        for i in range(m["layers"]):
            extra["block.%d" % i] = norms * x2
        extra["head"] = x2
        # multi-head latent attention's RMSNorms on the compressed q and kv
        lat = B * T * (m.get("kv_lora_rank", 0) + m.get("q_lora_rank", 0)) * 4
        for i in range(m["layers"]):
            extra["block.%d" % i] += lat
            # DeepSeek-V3's router scales its weights by a Python float: one
            # more host scalar (below) in each layer with experts
            if m.get("experts") and m.get("kv_lora_rank") and i >= m.get("dense_layers", 0):
                extra["block.%d" % i] += 8
    if m["type"] != "sequential" and m.get("attention", "eager") == "eager":
        # the attention scale is a Python float: autograd saves it as a 0-dim
        # double "wrapped number" (8 B) for the mul/div backward. That tensor
        # lives on the CPU, so on a GPU it is host memory: not in the ledger.
        # Gemma 2's soft-cap divides and multiplies by Python floats: two
        # more such host scalars per block
        per = 8 + (16 if float(m.get("attn_softcap", 0)) > 0 else 0)
        for i in range(m["layers"]):
            extra["block.%d" % i] = extra.get("block.%d" % i, 0) + per
    if m.get("activation") == "gelu_new":
        # gelu_new's three Python floats (0.5, sqrt(2/pi), 0.044715) are
        # 0-dim doubles its muls save: host memory on a GPU
        for i in range(m["layers"]):
            extra["block.%d" % i] = extra.get("block.%d" % i, 0) + 24
    if float(m.get("final_softcap", 0)) > 0:
        # the logits' soft-cap: the same two host scalars in the head
        extra["head"] = extra.get("head", 0) + 16
    if m.get("embedding_scale"):
        # Gemma's sqrt(D) normalizer, a 0-dim fp32 tensor made without a
        # device, saved by the mul: on a GPU it is host memory
        extra["embedding"] = extra.get("embedding", 0) + 4
    if m["type"] == "sequential":
        shape = list(m["input"])
        for i, item in enumerate(m["layers"]):
            (kind, a), = item.items()
            mod, out = seq_layers([item], shape)
            if kind == "avgpool" and (a or {}).get("global"):
                # global pooling is mean(-1, -2): 1.13 keeps its input
                extra["%d:avgpool" % i] = B * math.prod(shape) * 4
            shape = out
    return extra


def known_cpu_autocast(doc, B, T):
    """Per-block bytes CPU autocast (1.13) saves beyond CUDA autocast's.

    CUDA autocast runs F.softmax in fp32; CPU autocast in 1.13 does not list
    softmax, so GPT-2's softmax output is bf16 (2 B, not 4), and without
    dropout the PV matmul saves it directly instead of a bf16 cast copy.
    (Llama and GPT-NeoX ask for dtype=float32 themselves; BERT's and
    Falcon's fp32 additive masks promote the scores to fp32: they agree.)
    Llava agrees too: its decoder is Llama's, its CLIP layers ViT's layout
    (softmax asked in fp32, LayerNorm on the fp32 residual stream), and
    quick_gelu's mul and sigmoid, the projector's GELU and the patch conv
    are on neither autocast's fp32 list (measured: the bf16 casts, weight
    copies and fp32 statistics are those CUDA autocast makes)."""
    m = doc["model"]
    if m["type"] == "multimodal":
        return {}
    if m["type"] == "encoder-decoder" and m.get("activation") == "geglu":
        # CUDA autocast runs pow in fp32 (autocast_mode.cpp's fp32 list):
        # gelu_new keeps an fp32 copy of wi_0's output, and its tanh, 1 +
        # tanh and output are fp32 by promotion; 1.13's CPU autocast does
        # not list pow, so the four are bf16 here: 8 B per (B, T, F)
        # element fewer in each gated feed-forward
        F_, Td = m.get("ffn", 4 * m["hidden"]), target_len(doc, T)
        out = {"encoder.block.%d" % i: -8 * B * T * F_ for i in range(m["layers"])}
        for i in range(m.get("decoder_layers", m["layers"])):
            out["decoder.block.%d" % i] = -8 * B * Td * F_
        return out
    if m.get("router") == "sigmoid" and m.get("expert_renorm", True):
        # CUDA autocast runs sum in fp32 (its fp32_set_opt_dtype list), CPU
        # autocast in 1.13 does not: DeepSeek-V3's top-k weight sum, which
        # the in-place divide keeps, is bf16 here, B*T*2 B fewer per layer
        # with experts
        return {"block.%d" % i: -B * T * 2
                for i in range(m.get("dense_layers", 0), m["layers"])}
    if (m["type"] != "decoder" or m.get("norm", "layernorm") != "layernorm"
            or m.get("parallel_residual") or m.get("attention", "eager") != "eager"):
        return {}  # (a fused kernel: no softmax output)
    bhtt = B * m["heads"] * T * T
    per = -bhtt * 2 - (0 if float(m.get("dropout", 0)) > 0 else bhtt * 2)
    if m.get("activation") == "gelu_new":
        # CUDA autocast runs pow in fp32 on a copy of c_fc's output, which it
        # keeps (4 B an element), and tanh's result and 1 + tanh (kept) are
        # fp32 by promotion, so is the output, which c_proj reads through a
        # bf16 copy (kept, 2 B): 4 + 4 + 2 (0.5 * x, bf16) + 4 + 2 = 16 B
        # per (B, T, F) element. 1.13's CPU autocast does not list pow: pow
        # keeps c_fc's bf16 output, all is bf16 and c_proj keeps the output
        # itself, 2 + 2 + 2 + 2 + 2 = 10 B: 6 B fewer
        per -= 6 * B * T * m.get("ffn", 4 * m["hidden"])
    return {"block.%d" % i: per for i in range(m["layers"])}


# --------------------------------------------------------------------------

def measure(doc, B, T, ckpt, amp=False):
    torch.manual_seed(1)
    INPLACE[0] = not ckpt
    model = build(doc)
    model.train()
    batch = batch_for(doc, model, B, T)
    rec = Recorder(model)
    # the batch the loop holds is counted once, as the plan's `batch`
    # (docs/ledger.md, "The batch and the buffers"), not as a block's saved
    # tensor: the first layer saves the input and nll/mse_loss the targets
    for t in batch:
        rec.exclude.add(t.storage().data_ptr())
    batch_bytes = sum(t.numel() * t.element_size() for t in batch)
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    with torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = model.run(rec, batch, ckpt)
    saved_total, per_block = rec.total(), rec.per_block()
    params = sum(p.numel() for p in model.parameters())
    opt_name = doc.get("training", {}).get("optimizer", "adamw")
    if opt_name in ("adam", "adamw"):
        opt = (torch.optim.Adam if opt_name == "adam" else torch.optim.AdamW)(model.parameters(), foreach=False)
    elif opt_name == "sgd-momentum":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss.backward()
    opt.step()
    # states after one step; the per-parameter `step` counters are not
    # optimizer states in the planner's sense (docs/optimizers.md)
    states = 0
    for st in opt.state.values():
        for k, v in st.items():
            if torch.is_tensor(v) and k != "step":
                states += v.numel() * v.element_size()
    return saved_total, per_block, params, states, batch_bytes, buffer_bytes


def plan(memledger, path, B, T, ckpt, amp=False, Td=None):
    args = [memledger, "plan", path, "--format", "json", "--micro-batch", str(B),
            "--checkpoint", "full" if ckpt else "none",
            "--precision", "amp-bf16" if amp else "fp32"]
    if T:
        args += ["--seq-len", str(T)]
    if Td:
        args += ["--target-len", str(Td)]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode not in (0, 1):
        raise SystemExit("memledger failed: %s\n%s" % (" ".join(args), out.stderr))
    return json.loads(out.stdout)


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    memledger, models = sys.argv[1], sys.argv[2]
    doc_out = sys.argv[sys.argv.index("--doc") + 1] if "--doc" in sys.argv else None
    files = sorted(f for f in os.listdir(models) if f.endswith(".yaml"))
    passed = failed = 0
    rows = []

    def check(label, got, want, rel=TOL):
        nonlocal passed, failed
        ok = (got == want) if rel == 0 else (abs(got - want) <= rel * max(abs(want), 1))
        print("%s %s: predicted %s, measured %s" % ("ok  " if ok else "FAIL", label, got, want))
        if ok:
            passed += 1
        else:
            failed += 1
        return ok

    for f in files:
        path = os.path.join(models, f)
        with open(path) as fh:
            doc = load(fh)
        seq = doc["model"]["type"] == "sequential"
        B0 = doc.get("training", {}).get("micro_batch", 2)
        T0 = None if seq else doc.get("training", {}).get("seq_len", 16)
        sizes = [(B0, T0), (B0 * 2, T0 if seq else T0 // 2)]
        if doc["model"]["type"] == "multimodal":
            # the sequence holds the image tokens: halve the text only
            n_img = image_tokens(doc)
            sizes[1] = (B0 * 2, n_img + (T0 - n_img) // 2)
        # a batch of one: matmul's reshapes for bmm are views, no copies
        # (docs/inventory.md, "A batch of one")
        if not seq and B0 != 1:
            sizes.append((1, T0))
        runs = [(B, T, ckpt, False) for B, T in sizes for ckpt in (False, True)]
        if doc["name"] in AMP_MODELS:
            runs += [(B, T, False, True) for B, T in sizes]
        for B, T, ckpt, amp in runs:
            if True:
                name = "%s B=%d%s%s%s" % (doc["name"], B, "" if seq else " T=%d" % T,
                                          " ckpt=full" if ckpt else "", " amp-bf16" if amp else "")
                saved, per_block, params, states, batch_b, buffers_b = measure(doc, B, T or 1, ckpt, amp)
                extra = known_1_13(doc, B, T or 1)
                if amp:
                    for k, v in known_cpu_autocast(doc, B, T or 1).items():
                        extra[k] = extra.get(k, 0) + v
                # a multimodal model's tower: checkpointed with the decoder
                # (same), never (none), always (full); frozen, it saves nothing
                vmode = doc.get("training", {}).get("vision_tower", "same")
                vckpt = {"none": False, "full": True}.get(vmode, ckpt)
                if ckpt:  # checkpointed blocks save nothing of their own
                    extra = {k: v for k, v in extra.items() if ".block." not in "." + k
                             and ":" not in k and not k.startswith("vision.layer.")}
                if doc["model"]["type"] == "multimodal":
                    if vmode == "frozen" or vckpt:
                        extra = {k: v for k, v in extra.items() if not k.startswith("vision.layer.")}
                    elif ckpt:  # a tower left unchecked beside a checkpointed decoder
                        extra.update(clip_host_scalars(doc))
                    if vckpt and vmode != "frozen":
                        for k, v in unused_checkpointed(doc, B, amp).items():
                            extra[k] = extra.get(k, 0) + v
                # a vision encoder's sequence is its image's: no --seq-len
                j = plan(memledger, path, B, None if doc["model"].get("image_size") else T, ckpt,
                         amp, target_len(doc, T or 1))
                # a block whose output nothing reads (Llava's vision layers
                # past vision_feature_layer) keeps nothing (activations_saved
                # 0), but its forward saved its inventory, which the recorder
                # counts: compared with that (checkpointed, with
                # activations_saved as usual)
                unused = {b["name"] for b in j["blocks"] if b.get("unused_output")
                          and not (vckpt if doc["model"]["type"] == "multimodal" else ckpt)}
                pred_total = (j["bytes"]["activations_saved"] + sum(extra.values())
                              + sum(b["inventory_bytes"] for b in j["blocks"] if b["name"] in unused))
                if unused and doc["model"]["type"] == "multimodal" and projector_keeps_hidden(doc, B, amp):
                    # the first unused layer's input, its inventory's and the
                    # plan's kept bytes: one storage
                    pred_total -= hidden_bytes(doc, B)
                check(name + " params", j["params"], params, 0)
                check(name + " optimizer states", j["bytes"]["optimizer_states"], states, 0)
                check(name + " batch", j["bytes"]["batch"], batch_b, 0)
                check(name + " buffers", j["bytes"]["buffers"], buffers_b, 0)
                rel = 0 if doc["name"] in EXACT_MODELS else TOL
                ok = check(name + " activations saved", pred_total, saved, rel)
                blocks_ok = True
                for b in j["blocks"]:
                    own = b["inventory_bytes"] if b["name"] in unused else b["activations_saved"]
                    pb = own + extra.get(b["name"], 0)
                    mb = per_block.get(b["name"], 0)
                    blocks_ok = check("%s %s" % (name, b["name"]), pb, mb, rel) and blocks_ok
                for k in per_block:
                    if k not in {b["name"] for b in j["blocks"]}:
                        check("%s unattributed block %s" % (name, k), 0, per_block[k], 0)
                rows.append((name, params, pred_total, saved, ok and blocks_ok,
                             sum(extra.values())))
    if doc_out:
        with open(doc_out, "w") as out:
            out.write("| model and configuration | params | predicted saved (B) | measured saved (B) "
                      "| difference | known-difference adjustment (B) | all blocks within 1% |\n")
            out.write("|---|---|---|---|---|---|---|\n")
            for name, params, pred, meas, ok, adj in rows:
                diff = (pred - meas) / meas * 100 if meas else 0
                out.write("| %s | %d | %d | %d | %+.3f%% | %d | %s |\n"
                          % (name, params, pred, meas, diff, adj, "yes" if ok else "NO"))
    print("%d passed, %d failed" % (passed, failed))
    if passed + failed == 0:
        print("FAIL no model under %s: nothing was checked" % models)
        return 1
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
