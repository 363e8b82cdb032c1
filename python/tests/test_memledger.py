"""The Python package against values derived by hand (README.md, the
golden cases' `why` files) and against the command line's JSON.

Runs against the installed package, or with PYTHONPATH=python and
MEMLEDGER_LIBRARY=build/src/libmemledger.so (the meson test). With
MEMLEDGER_CLI (the memledger binary of the same build) the reports are also
compared with `memledger VERB --format json`, key for key."""
import json
import os
import subprocess

import pytest

import memledger

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "models")
GPT2 = os.path.join(MODELS, "gpt2-small.yaml")
MLP2 = os.path.join(MODELS, "mlp2.yaml")
CLI = os.environ.get("MEMLEDGER_CLI")

# models/mlp2.yaml as a dict: 1000 -> 10000 -> 1000, no biases, fp32 Adam
MLP2_DICT = {
    "name": "mlp2",
    "model": {"type": "sequential", "input": [1000], "loss": "mse",
              "layers": [{"linear": {"out": 10000, "bias": False}}, {"gelu": {}},
                         {"linear": {"out": 1000, "bias": False}}]},
    "training": {"micro_batch": 256, "precision": "fp32", "optimizer": "adam",
                 "optimizer_impl": "foreach"},
    "device": {"memory": "8GiB", "budget": "6.5GiB", "runtime_reserve": "512MiB"},
}


def test_gpt2_params():
    # README: 50257 x 768 token + 1024 x 768 position embeddings, 12 blocks of
    # 7,087,872, the final LayerNorm's 1,536
    want = 50257 * 768 + 1024 * 768 + 12 * 7087872 + 1536
    assert want == 124439808
    r = memledger.plan(GPT2, micro_batch=4)
    assert r["params"] == want
    assert r["config"]["micro_batch"] == 4


def check_mlp2(r):
    # tests/cli/cases/plan-mlp2-json/why: at the step, params 80,000,000 +
    # grads 80,000,000 + Adam's states 160,000,000 + the step's temporary
    # 80,000,000, plus the output the loop keeps, 256 x 1000 x 4 = 1,024,000,
    # and the batch it holds, the input and the mse target, 2 x 1,024,000
    assert r["params"] == 2 * 1000 * 10000
    peak = 80000000 + 80000000 + 160000000 + 80000000 + 3 * 256 * 1000 * 4
    assert peak == 403072000
    assert r["bytes"]["peak"] == peak
    assert r["bytes"]["peak_total"] == peak + (512 << 20)
    assert r["peak"]["phase"] == "optimizer"
    # saved at the end of forward: z1 and a, 256 x 10000 x 4 each, and y; the
    # input and the target are the batch's
    assert r["bytes"]["activations_saved"] == 2 * 10240000 + 1024000
    assert r["bytes"]["batch"] == 2 * 1024000


def test_mlp2_peak_from_yaml_and_dict():
    # the allocated view (by default a plan also simulates the caching
    # allocator, whose cache the peak total then holds)
    check_mlp2(memledger.plan(MLP2, allocator="none"))
    check_mlp2(memledger.plan(MLP2_DICT, allocator="none"))


def test_keywords_override_the_file():
    r = memledger.plan(MLP2, micro_batch=128, precision="amp-bf16", device="16GiB",
                       budget="12GiB", checkpoint="none", zero=0)
    assert r["config"]["micro_batch"] == 128
    assert r["config"]["precision"] == "amp-bf16"
    assert r["device"]["memory"] == 16 << 30
    assert r["device"]["budget"] == 12 << 30
    # --device drops the file's budget line: memory - reserve
    r = memledger.plan(MLP2, device="16GiB")
    assert r["device"]["budget"] == (16 << 30) - (512 << 20)


def test_fused_logits_keywords():
    # tests/unit/test_fused.c: the fused loss's forward transient with
    # 4-row chunks of a 1000-token vocabulary over D = 8, BT = 16:
    # 2 x 4 x 1000 x 4 + 16 x 5 = 32,080 B, its chunk echoed in the config
    model = {"name": "f", "model": {"type": "decoder", "layers": 1, "hidden": 8,
                                    "heads": 2, "ffn": 16, "activation": "swiglu",
                                    "norm": "rmsnorm", "vocab": 1000, "position": "none",
                                    "tied_embeddings": False, "bias": False, "dropout": 0},
             "training": {"micro_batch": 1, "seq_len": 16, "optimizer": "sgd"}}
    r = memledger.plan(model, logits="fused", logits_chunk=4)
    assert r["config"]["logits"] == "fused" and r["config"]["logits_chunk"] == 4
    loss = [b for b in r["blocks"] if b["name"] == "loss"][0]
    assert loss["params"] == 8000 and loss["activations_saved"] == 0
    events = memledger.timeline(model, logits="fused", logits_chunk=4)
    assert 32080 in [e["delta"] for e in events if e["phase"] == "loss"]
    with pytest.raises(memledger.Error):
        memledger.plan(model, logits_chunk=4)


def test_device_by_name_or_size():
    # a preset: mlp2's 25.6 GFLOP per iteration (fp32) at the A100's dense
    # fp32 19.5 TFLOP/s (docs/devices.md), efficiency 1: the FLOPs alone, a
    # lower bound on the per-op model's step time (docs/time.md)
    r = memledger.plan(MLP2, device="a100-80gb")
    assert r["device"]["memory"] == 80 * 2**30
    assert abs(r["time"]["flops_s"] - 25.6e9 / 19.5e12) < 1e-15
    assert r["step_time_s"] == r["time"]["step_s"] > r["time"]["flops_s"]
    assert r["time"]["source"] == "datasheet"
    # a size is memory only: no step time from the model file's own figure
    assert memledger.plan(MLP2, device="8GiB")["step_time_s"] is None
    with pytest.raises(memledger.Error):
        memledger.plan(MLP2, device="h300")


def test_fit_and_global_batch():
    r = memledger.fit(GPT2, precision="amp-bf16", device="8GiB", budget="6.5GiB",
                      global_batch=64, checkpoint="auto")
    assert r["fits"] is True
    mb, acc = r["micro_batch"], r["grad_accum"]
    assert mb * acc == 64 and r["effective_batch"] == 64
    # the chosen micro-batch fits, and one more sample does not at its policy
    p = memledger.plan(GPT2, precision="amp-bf16", device="8GiB", budget="6.5GiB",
                       micro_batch=mb, checkpoint=r["plan"].split(":")[0])
    assert p["device"]["fits"] is True


def test_compare_and_timeline():
    rows = memledger.compare(MLP2)
    names = [row["checkpoint"] for row in rows]
    assert names[:2] == ["none", "full"] and "sqrt" in names
    events = memledger.timeline(MLP2)
    assert isinstance(events, list) and events
    # the curve's highest point is the plan's allocator peak
    assert max(sum(e["live"].values()) for e in events) == 403072000


def test_calibrate_points():
    # peak = 1 GiB + 0.5 GiB per sample; budget 5.25 GiB: (5.25 - 1) / 0.5 = 8.5
    pts = [(1, "1.5GiB"), (2, 2 << 30), {"micro_batch": 4, "peak": 3 << 30}]
    r = memledger.calibrate_points(pts, budget="5.25GiB", at=8)
    assert r["points"] == 3
    assert r["fixed_bytes"] == 1 << 30 and r["per_sample_bytes"] == 1 << 29
    assert r["max_micro_batch"] == 8 and r["extrapolated"] is True
    assert r["peak_at"] == 5 << 30


class FakeConfig:
    """What transformers.PretrainedConfig offers the binding: to_dict()."""

    def __init__(self, d):
        self.d = d

    def to_dict(self):
        return dict(self.d)


def test_hugging_face_config():
    path = os.path.join(MODELS, "hf", "gpt2", "config.json")
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    by_path = memledger.plan(path, micro_batch=2, seq_len=512)
    by_dict = memledger.plan(cfg, micro_batch=2, seq_len=512)
    by_obj = memledger.plan(FakeConfig(cfg), micro_batch=2, seq_len=512)
    # the model's folder, as from_pretrained takes it: its config.json
    by_folder = memledger.plan(os.path.dirname(path), micro_batch=2, seq_len=512)
    # GPT-2 small from its config.json: the preset's count
    assert by_path["params"] == by_dict["params"] == by_obj["params"] == 124439808
    assert by_folder["params"] == 124439808
    assert by_dict["bytes"] == by_path["bytes"] == by_folder["bytes"]
    # through the command line too (triage runs the memledger binary)
    t = memledger.triage(os.path.dirname(path), micro_batch=2, seq_len=512)
    # fp32 weights, 4 bytes each, and the model named for its folder
    assert t["model"] == "gpt2" and t["peak"]["breakdown"]["params"] == 4 * 124439808


def test_attention_keyword():
    # the attention implementation is the model's: flash keeps no T x T
    # tensor, so a GPT-2 block saves less than eager's; the plan says which
    eager = memledger.plan(GPT2, micro_batch=2)
    flash = memledger.plan(GPT2, micro_batch=2, attention="flash")
    assert eager["config"]["attention"] == "eager" and flash["config"]["attention"] == "flash"
    assert flash["bytes"]["activations_saved"] < eager["bytes"]["activations_saved"]
    assert memledger.plan(MLP2)["config"]["attention"] is None
    with pytest.raises(memledger.Error) as e:
        memledger.plan(GPT2, attention="flex")
    assert "attention='flex'" in str(e.value) and "use eager, sdpa or flash" in str(e.value)


def test_errors():
    with pytest.raises(memledger.Error) as e:
        memledger.plan(MLP2, micro_batch=0)
    assert e.value.code == "ML_RANGE"
    assert "micro_batch=0" in e.value.message and "training.micro_batch" in e.value.message
    bad = dict(MLP2_DICT, model=dict(MLP2_DICT["model"], type="transformer"))
    with pytest.raises(memledger.Error) as e:
        memledger.plan(bad)
    assert e.value.code == "ML_SCHEMA" and e.value.path == "<dict>" and e.value.line == 1
    with pytest.raises(memledger.Error) as e:
        memledger.plan(os.path.join(MODELS, "no-such.yaml"))
    assert e.value.code == "ML_IO"
    with pytest.raises(memledger.Error) as e:
        memledger.fit(MLP2, global_batch=0)
    assert e.value.code == "ML_RANGE"
    with pytest.raises(memledger.Error) as e:
        memledger.plan(MLP2, checkpoint="auto")
    assert "auto is for fit" in e.value.message
    with pytest.raises(TypeError, match="did you mean 'micro_batch'"):
        memledger.plan(MLP2, micro_bach=4)
    with pytest.raises(TypeError, match="is for fit"):
        memledger.plan(MLP2, global_batch=8)


@pytest.mark.skipif(not CLI, reason="MEMLEDGER_CLI (the memledger binary) not given")
@pytest.mark.parametrize("verb,flags,kw", [
    ("plan", ["--micro-batch", "4", "--device", "8GiB", "--checkpoint", "full"],
     dict(micro_batch=4, device="8GiB", checkpoint="full")),
    ("fit", ["--global-batch", "64", "--checkpoint", "auto", "--precision", "amp-bf16"],
     dict(global_batch=64, checkpoint="auto", precision="amp-bf16")),
    ("compare", ["--micro-batch", "2", "--budget", "6.5GiB"],
     dict(micro_batch=2, budget="6.5GiB")),
    ("timeline", ["--micro-batch", "1", "--seq-len", "128"], dict(micro_batch=1, seq_len=128)),
    ("plan", ["--attention", "flash", "--micro-batch", "2"], dict(attention="flash", micro_batch=2)),
    ("plan", ["--data-parallel", "4", "--zero", "3", "--offload", "params", "--device",
              "h100-sxm", "--interconnect", "200", "--pcie", "25"],
     dict(data_parallel=4, zero=3, offload="params", device="h100-sxm", interconnect=200,
          pcie=25)),
    ("plan", ["--tp", "2", "--no-sp", "--engine", "megatron", "--precision", "bf16-master"],
     dict(tp=2, sp=False, engine="megatron", precision="bf16-master")),
    ("plan", ["--dp", "8", "--dist-optimizer", "--engine", "megatron", "--precision",
              "bf16-master"],
     dict(data_parallel=8, dist_optimizer=True, engine="megatron", precision="bf16-master")),
    ("compare", ["--parallel", "tp4", "--device", "h100-sxm"], dict(parallel="tp4", device="h100-sxm")),
])
def test_same_json_as_the_cli(verb, flags, kw):
    out = subprocess.run([CLI, verb, GPT2, "--format", "json"] + flags,
                         stdout=subprocess.PIPE, check=False).stdout
    assert getattr(memledger, verb)(GPT2, **kw) == json.loads(out)


def test_example_runs(capsys):
    import runpy
    runpy.run_path(os.path.join(ROOT, "python", "examples", "plan_in_python.py"))
    out = capsys.readouterr().out
    assert "params 124439808" in out and "ML_RANGE" in out


def test_bad_numbers_are_refused():
    # a negative or oversized byte count would wrap in C's uint64
    with pytest.raises(ValueError):
        memledger.calibrate_points([(1, 100), (2, 200)], budget=-5)
    with pytest.raises(ValueError):
        memledger.calibrate_points([(1, 100), (2, 200)], at=2**70)
    with pytest.raises(TypeError):
        memledger.calibrate_points([(1, 100), (2, 200)], at=2.7)
    with pytest.raises(ValueError):
        memledger.plan(MLP2, precision="fp32\0x")


def test_escapes_in_messages_are_visible():
    # a flag value quoted back in the library's message
    # reaches str(Error) and .message with ESC and BEL written \x1b and \x07
    # (as the command line writes them, docs/cli.md), never raw
    with pytest.raises(memledger.Error) as e:
        memledger.plan(MLP2, device="h100\x1b[31m")
    assert "\x1b" not in str(e.value) and "\x1b" not in e.value.message
    assert "unknown device 'h100\\x1b[31m'" in e.value.message
    with pytest.raises(memledger.Error) as e:
        memledger.plan(MLP2, checkpoint="x\x1b]0;pwn\x07")
    assert "'x\\x1b]0;pwn\\x07'" in str(e.value) and "\x07" not in str(e.value)


def test_paths_with_nul_and_endless_points():
    # C reads a path up to its NUL, so "mlp2.yaml\0junk"
    # would plan mlp2: refused as a NUL in any other argument is
    with pytest.raises(ValueError, match="a NUL character in a path"):
        memledger.plan(GPT2 + "\0junk")
    with pytest.raises(ValueError, match="a NUL character in a path"):
        memledger.calibrate_points(os.path.join(ROOT, "README.md\0x"))
    # /dev/zero never ends: one byte past the library's 16 MiB limit is read
    # (16 MiB + 1 of zeros), and the library refuses it by its limit
    with pytest.raises(memledger.Error, match="larger than 16 MiB"):
        memledger.calibrate_points("/dev/zero")


def test_pairings_the_cli_refuses_are_refused_here_too():
    # each pair is refused by the command line (exit 2); the library's
    # verbs refuse it the same way, naming the keys, never the last one wins
    cases = [
        (memledger.plan, dict(parallel="tp2.dp2", tp=4), "the layout is given once"),
        (memledger.fit, dict(global_batch=64, grad_accum=4, device="80GiB"),
         "derives the accumulation steps from the micro-batch"),
        (memledger.plan, dict(reduce_bucket_size=5), "sizes DeepSpeed's ZeRO buckets"),
        (memledger.plan, dict(allocator="none", blas_workspace="1MiB"),
         "applies to a simulated allocator only"),
    ]
    for verb, kw, says in cases:
        with pytest.raises(memledger.Error) as e:
            verb(GPT2, **kw)
        assert says in e.value.message, (kw, e.value.message)
    # the message names the keywords given, as the command line its flags
    with pytest.raises(memledger.Error) as e:
        memledger.fit(GPT2, global_batch=64, micro_batches=4, device="80GiB")
    assert e.value.message.startswith("micro_batches=: fit's global_batch= derives")
    # a model file's key stays the file's key in the message
    bk = os.path.join(ROOT, "tests", "cli", "cases", "yaml-bucket-no-zero", "bk.yaml")
    with pytest.raises(memledger.Error) as e:
        memledger.plan(bk)
    assert e.value.message.startswith("training.reduce_bucket_size: sizes DeepSpeed's")
    assert memledger.plan(bk, zero=2)["config"]["zero"] == 2
    # the bucket size with ZeRO is used: planned
    assert memledger.plan(GPT2, reduce_bucket_size=5, zero=2)["params"] == 124439808


def test_list_numbers_are_whole():
    # a float or a bool in a block list is refused, never cut to an integer
    for bad in ([1.7], [True, 2], ["1"]):
        with pytest.raises(TypeError, match="not a whole number"):
            memledger.plan(GPT2, checkpoint=bad)
    with pytest.raises(TypeError, match="not a whole number"):
        memledger.plan(GPT2, pp=2, pp_layers=[6.5, 6.5])
    assert memledger.plan(GPT2, checkpoint=[0, 3])["config"]["checkpoint"] == "[0, 3]"


def test_max_split_size_counts_mib_on_both_paths():
    # 25 MiB three ways, through the library and through the command line
    # (lengths=): the same reserved peak each time
    peaks = set()
    for v in (25, "25", "25MiB"):
        peaks.add(memledger.plan(GPT2, device="24GiB", max_split_size=v)["reserved"]["peak"])
        peaks.add(memledger.plan(GPT2, device="24GiB", max_split_size=v,
                                 lengths="p50=1000,max=1024")["reserved"]["peak"])
    assert len(peaks) == 1
    with pytest.raises(ValueError, match="not a whole number of MiB"):
        memledger.plan(GPT2, max_split_size="25.5MiB")
    with pytest.raises(TypeError):
        memledger.plan(GPT2, max_split_size=25.0)


def test_hf_dict_named_alike_on_both_paths():
    path = os.path.join(MODELS, "hf", "gpt2", "config.json")
    with open(path, encoding="utf-8") as f:
        c = json.load(f)
    c.pop("_name_or_path", None)
    # no _name_or_path: its model_type names it, through the library and the CLI
    assert memledger.plan(c)["model"] == "gpt2"
    assert memledger.plan(c, lengths="max=64")["model"] == "gpt2"
    # a trailing slash is no empty name, nor is "." a name
    assert memledger.plan(dict(c, _name_or_path="org/tiny-gpt2/"))["model"] == "tiny-gpt2"
    assert memledger.plan(dict(c, _name_or_path="."))["model"] == "gpt2"
    with pytest.raises(memledger.Error) as e:
        memledger.plan(dict(c, n_layer=-1))
    assert e.value.path == "<dict>"


def test_calibrate_points_input():
    # one value a cell: a line break would add rows the caller never gave
    with pytest.raises(ValueError, match="one value a cell"):
        memledger.calibrate_points([(1, "1GiB\n3,4GiB"), (2, "2GiB")])
    with pytest.raises(memledger.Error) as e:
        memledger.calibrate_points("/nonexistent/points.csv")
    assert e.value.code == "ML_IO" and e.value.path == "/nonexistent/points.csv"
    with pytest.raises(ValueError, match="at least 1 byte"):
        memledger.calibrate_points([(1, "1GiB"), (2, "2GiB")], budget=0)
    # a point of three values, or a string: said, not unpacked
    for bad in ((1, 2, 3), "12"):
        with pytest.raises(ValueError, match="a point is"):
            memledger.calibrate_points([(1, "1GiB"), bad])
    # a flat line: any micro-batch fits, up to the limit a plan takes (2^24)
    r = memledger.calibrate_points([(1, "3GiB"), (2, "3GiB")], budget="6GiB")
    assert r["max_micro_batch"] == 1 << 24
