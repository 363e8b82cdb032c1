"""The verbs the package runs through the command line (lengths, triage,
colocate, report, allocator, emit) against values derived by hand, and,
with MEMLEDGER_CLI, against `memledger VERB --format json` key for key."""
import csv
import json
import os
import subprocess
import warnings

import pytest

import memledger

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "models")
MLP2 = os.path.join(MODELS, "mlp2.yaml")
AGNEWS = os.path.join(MODELS, "agnews-classifier.yaml")
AGNEWS_LENGTHS = os.path.join(MODELS, "lengths", "agnews-tokens.csv")
CLI = os.environ.get("MEMLEDGER_CLI")

# models/mlp2.yaml at its own settings (test_memledger.check_mlp2): the
# allocator peak 403,072,000 bytes at the optimizer step, plus the default
# runtime reserve of 512 MiB = 536,870,912 in every process
MLP2_PEAK = 80000000 + 80000000 + 160000000 + 80000000 + 3 * 256 * 1000 * 4
MLP2_TOTAL = MLP2_PEAK + (512 << 20)


def test_colocate_two_jobs():
    assert MLP2_PEAK == 403072000 and MLP2_TOTAL == 939942912
    # the allocated view of each job (by default each simulates its cache)
    r = memledger.colocate([(MLP2, {"allocator": "none"}),
                            (MLP2, {"micro_batch": 256, "allocator": "none"})], device="8GiB")
    assert [j["peak_total"] for j in r["jobs"]] == [MLP2_TOTAL, MLP2_TOTAL]
    # two processes, each its own reserve: the peaks lined up
    assert r["worst"]["peak_total"] == 2 * MLP2_TOTAL
    assert r["worst"]["headroom"] == (8 << 30) - 2 * MLP2_TOTAL
    assert r["worst"]["fits"] is True
    # a job's settings become its flags, numbered as the command line's
    assert r["jobs"][1]["job"] == MLP2 + " --micro-batch 256 --allocator none"
    # no step time (no device throughput): no time axis
    assert r["aligned"] is None and r["p_time_over"] is None


def test_colocate_over_the_device_is_a_report():
    # three jobs of 939,942,912 = 2,819,828,736 > 2 GiB (2,147,483,648)
    r = memledger.colocate([(MLP2, {"allocator": "none"})] * 3, device="2GiB")
    assert r["worst"]["fits"] is False
    assert r["worst"]["headroom"] == (2 << 30) - 3 * MLP2_TOTAL


def test_triage_peak_and_remedies():
    # 768 MiB = 805,306,368 < 939,942,912: does not fit, and the peak is the
    # plan's, at the optimizer step, made of check_mlp2's parts
    r = memledger.triage(MLP2, device="768MiB")
    p = r["peak"]
    assert p["bytes"] == MLP2_PEAK and p["peak_total"] == MLP2_TOTAL
    assert p["fits"] is False and p["phase"] == "optimizer"
    b = p["breakdown"]
    assert (b["params"], b["grads"], b["optimizer_states"]) == (80000000, 80000000, 160000000)
    # Adam's states are the largest part (160,000,000): 8-bit states are a
    # remedy, and a remedy that fits is below the peak that did not
    names = [x["name"] for x in r["remedies"]]
    assert "adam-8bit" in names
    assert all(x["peak"] < MLP2_PEAK for x in r["remedies"] if x["fits"])


def _csv_lengths(path):
    """(min, max) of a lengths CSV (length,count rows, '#' comments)."""
    with open(path, encoding="utf-8") as f:
        rows = [r for r in csv.reader(ln for ln in f if not ln.startswith("#"))]
    lengths = [int(r[0]) for r in rows[1:] if r and int(r[1]) > 0]
    return min(lengths), max(lengths)


def test_lengths_from_csv():
    lo, hi = _csv_lengths(AGNEWS_LENGTHS)
    r = memledger.lengths(AGNEWS, AGNEWS_LENGTHS, micro_batch=64)
    assert (r["lengths"]["min"], r["lengths"]["max"]) == (lo, hi)
    assert r["lengths"]["batching"] == "padded"
    # the same through plan's keyword
    assert memledger.plan(AGNEWS, lengths=AGNEWS_LENGTHS, micro_batch=64) == r


def test_allocator_rows():
    # PyTorch's caching allocator (docs/allocator.md): 1,000 bytes round up to
    # 512-byte blocks, 1,024, from a 2 MiB small segment; 3 MiB (above 1 MiB,
    # below 10 MiB) from a 20 MiB large segment
    r = memledger.allocator([("alloc", 1, 1000), ("alloc", 2, 3 << 20), ("free", 1)],
                            device="1GiB")
    assert r["allocated_peak"] == 1024 + (3 << 20)
    assert r["requested_peak"] == 1000 + (3 << 20)
    assert r["reserved_peak"] == (2 << 20) + (20 << 20)
    assert r["segments_peak"] == 2
    assert (r["events"], r["allocs"], r["frees"], r["oom_at"]) == (3, 2, 1, None)
    assert r["trace"] == "<trace>"


def test_allocator_start(tmp_path):
    # a start state by hand (docs/allocator.md): 1,000 bytes take a 1,024-byte
    # block of a 2 MiB small segment; 3 MiB a block of a 20 MiB large one,
    # freed and cached: 22 MiB reserved, 1,024 bytes allocated, 2 segments
    start = tmp_path / "start.csv"
    start.write_text("action,id,bytes\nalloc,a,1000\nalloc,b,3145728\nfree,b,\n")
    want = {"reserved": (2 << 20) + (20 << 20), "allocated": 1024, "segments": 2}
    r = memledger.plan(MLP2, device="8GiB", allocator_start=start)
    assert r["reserved"]["start"] == want
    # the start's tensors stay allocated under the plan's own peak
    assert r["reserved"]["peak"] >= want["reserved"]
    assert memledger.plan(MLP2, device="8GiB")["reserved"]["start"] is None
    # None: not given, as for every keyword
    assert memledger.plan(MLP2, device="8GiB", allocator_start=None, lengths=None) == \
        memledger.plan(MLP2, device="8GiB")
    a = memledger.allocator([("alloc", 1, 8)], allocator_start=start)
    assert {k: a["start"][k] for k in want} == want
    assert a["start"]["trace"] == str(start)
    # a start that holds a 1 GiB tensor to the end: a segment of its own
    # (above 10 MiB, a multiple of 2 MiB), never free for the plan's
    # tensors, so every policy's device total is its own plus 1 GiB, less
    # the 20 MiB segment of cuBLAS's two workspaces (8,519,680 B each) that
    # the plan from an empty cache makes and a start state has made before
    held = tmp_path / "held.csv"
    held.write_text("action,id,bytes\nalloc,c,%d\n" % (1 << 30))
    rows = memledger.compare(MLP2, device="8GiB", allocator_start=held)
    base = memledger.compare(MLP2, device="8GiB")
    assert [r["checkpoint"] for r in rows] == [r["checkpoint"] for r in base]
    assert [r["peak_total"] - b["peak_total"] for r, b in zip(rows, base)] == \
        [(1 << 30) - (20 << 20)] * len(base)
    # blas_workspace= (device.blas_workspace): 0 makes none, so the same
    # 20 MiB less; 12 MiB each (above 10 MiB) takes a 12 MiB segment of its
    # own, twice: 2 x 12 - 20 MiB more than the default
    none = memledger.plan(MLP2, device="8GiB", blas_workspace=0)["reserved"]["peak"]
    r12 = memledger.plan(MLP2, device="8GiB", blas_workspace="12MiB")["reserved"]["peak"]
    base_peak = memledger.plan(MLP2, device="8GiB")["reserved"]["peak"]
    assert (base_peak - none, r12 - base_peak) == (20 << 20, (24 - 20) << 20)
    # the timeline's events are the allocated view, which a start state
    # does not change: the keyword is refused there
    with pytest.raises(TypeError, match="allocator_start"):
        memledger.timeline(MLP2, device="8GiB", allocator_start=start)
    with pytest.raises(memledger.Error, match="allocator-start"):
        memledger.plan(MLP2, device="8GiB", allocator="none", allocator_start=start)
    if CLI:
        out = subprocess.run([CLI, "plan", MLP2, "--device", "8GiB", "--allocator-start",
                              str(start), "--format", "json"], capture_output=True, check=True)
        assert json.loads(out.stdout) == r


def test_report_html(tmp_path):
    html = memledger.report(MLP2)
    assert html.startswith("<!DOCTYPE html>") and "mlp2" in html
    out = tmp_path / "r.html"
    assert memledger.report(MLP2, output=out) == out
    assert out.read_text(encoding="utf-8") == html


def test_emit_settings():
    d = memledger.emit(MLP2, "deepspeed", micro_batch=4, grad_accum=8)
    # DeepSpeed's train_batch_size = micro-batch x accumulation x devices
    assert d["train_micro_batch_size_per_gpu"] == 4
    assert d["gradient_accumulation_steps"] == 8
    assert d["train_batch_size"] == 4 * 8 * 1
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        flags = memledger.emit(MLP2, "hf-trainer")
    assert "--per_device_train_batch_size 256" in flags
    # the plan keeps the logits, Trainer drops them: exit status 4, a warning
    assert [x.category for x in w] == [memledger.EmitWarning]
    assert "logits" in str(w[0].message)
    with pytest.raises(ValueError):
        memledger.emit(MLP2, "megatron-lm")
    # a target the command line has, refused there for this model (exit 2)
    with pytest.raises(memledger.Error, match="pretrain_gpt.py trains a decoder"):
        memledger.emit(MLP2, "megatron")


def test_emit_refuses_a_plan_that_does_not_fit():
    # 768 MiB less the 512 MiB reserve leaves 256 MiB for 403,072,000 bytes
    with pytest.raises(memledger.Error) as e:
        memledger.emit(MLP2, "deepspeed", device="768MiB")
    assert e.value.code == "CLI" and e.value.status == 1


def test_errors_name_the_input():
    bad = {"model": {"type": "sequential", "input": [4], "loss": "msee",
                     "layers": [{"linear": {"out": 3}}]}}
    with pytest.raises(memledger.Error) as e:
        memledger.triage(bad)
    assert (e.value.code, e.value.status, e.value.path, e.value.line) == ("CLI", 2, "<dict>", 1)
    assert "did you mean 'mse'?" in e.value.message
    with pytest.raises(TypeError, match="did you mean 'oom_phase'"):
        memledger.triage(MLP2, oom_phse="backward")
    with pytest.raises(TypeError):
        memledger.allocator([("alloc", 1, 8)], micro_batch=4)


def test_hugging_face_dict_names():
    # a config dict goes to the command line as a temporary config.json in a
    # folder named after _name_or_path, made a safe file name: "..", "/"
    # and "a/../../b" cannot leave the temporary directory
    with open(os.path.join(MODELS, "hf", "gpt2", "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    for name in ("..", "a/../../b", "/"):
        cfg["_name_or_path"] = name
        r = memledger.lengths(cfg, "p50=100,max=512", micro_batch=2)
        # GPT-2 small's 124,439,808 parameters (test_memledger.test_gpt2_params)
        assert r["params"] == 124439808


def _cli_json(args):
    out = subprocess.run([CLI] + args + ["--format", "json"], stdout=subprocess.PIPE,
                         check=False).stdout
    return json.loads(out)


@pytest.mark.skipif(not CLI, reason="MEMLEDGER_CLI (the memledger binary) not given")
def test_same_json_as_the_cli(tmp_path):
    assert memledger.triage(MLP2, device="768MiB", oom_phase="optimizer") == _cli_json(
        ["triage", MLP2, "--device", "768MiB", "--oom-phase", "optimizer"])
    assert memledger.colocate([MLP2, (MLP2, {"micro_batch": 8})], device="8GiB") == _cli_json(
        ["colocate", "--device", "8GiB", MLP2, MLP2 + " --micro-batch 8"])
    assert memledger.lengths(AGNEWS, "p50=43,p99=121,max=256", micro_batch=64) == _cli_json(
        ["plan", AGNEWS, "--lengths", "p50=43,p99=121,max=256", "--micro-batch", "64"])
    trace = tmp_path / "t.csv"
    trace.write_text("action,id,bytes\nalloc,1,1000\nalloc,2,3145728\nfree,1\n")
    assert memledger.allocator(str(trace), allocator="expandable") == _cli_json(
        ["allocator", str(trace), "--allocator", "expandable"])


def test_keywords_as_the_flags_on_both_paths():
    gpt2 = os.path.join(MODELS, "gpt2-small.yaml")
    # a switch's words work through the command line as through the library
    for v in ("off", "false", False):
        r = memledger.plan(gpt2, sp=v, lengths="max=64")
        assert r["lengths"]["max"] == 64
    with pytest.raises(ValueError, match="give True or False"):
        memledger.plan(gpt2, sp="maybe", lengths="max=64")
    # micro_batches= is --micro-batches: the accumulation steps
    assert memledger.plan(gpt2, micro_batches=4)["config"]["grad_accum"] == 4
    # a keyword another verb takes says so, not "did you mean"
    with pytest.raises(TypeError, match="lengths= is not for compare"):
        memledger.compare(gpt2, lengths="max=64")
    # a model file's switch turned off, through the library and the command line
    ovl = os.path.join(ROOT, "tests", "cli", "cases", "plan-no-overlap-grad-reduce",
                       "overlap.yaml")
    for kw in ({}, {"lengths": "max=1024"}):
        r = memledger.plan(ovl, overlap_grad_reduce=False, **kw)
        assert r["config"]["parallel"]["overlap_grad_reduce"] is False
    with pytest.raises(ValueError, match="sp='auto' through the command line"):
        memledger.plan(gpt2, sp="auto", lengths="max=64")
    # the library's verbs say which verb takes a keyword too
    with pytest.raises(TypeError, match="gpus= is not for plan"):
        memledger.plan(gpt2, gpus=8)
    # fit gpus=: the search over layouts, as fit --gpus
    r = memledger.fit(gpt2, gpus=8, global_batch=64, device="80GiB")
    assert r["gpus"] == 8 and r["global_batch"] == 64
