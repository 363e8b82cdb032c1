"""The verbs: plan, fit, compare, timeline and calibrate_points, with
keyword arguments named like the command line's flags (--micro-batch is
micro_batch=), returning what `memledger VERB --format json` prints
(docs/cli.md) as plain Python values."""
import ctypes
import difflib
import json
import operator
import os
import re

from . import _cli, _native
from ._native import Error, lib

# keyword -> the library's key (ml_job_set), in the order the command line
# applies its flags: training, then device (device before budget: a new
# capacity drops the budget line), then fit's request and the profile
SETTINGS = (
    ("micro_batch", "training.micro_batch"), ("seq_len", "training.seq_len"),
    ("grad_accum", "training.grad_accum"), ("precision", "training.precision"),
    ("optimizer", "training.optimizer"), ("optimizer_impl", "training.optimizer_impl"),
    ("engine", "training.engine"), ("parallel", "parallel.layout"), ("tp", "parallel.tp"),
    ("sp", "parallel.sp"), ("pp", "parallel.pp"), ("vpp", "parallel.vpp"),
    ("cp", "parallel.cp"), ("ep", "parallel.ep"), ("etp", "parallel.etp"),
    ("pp_schedule", "parallel.pp_schedule"), ("pp_layers", "parallel.pp_layers"),
    ("dist_optimizer", "parallel.dist_optimizer"), ("dp_shard", "parallel.dp_shard"),
    ("overlap_grad_reduce", "parallel.overlap_grad_reduce"),
    ("data_parallel", "training.data_parallel"), ("micro_batches", "training.grad_accum"),
    ("zero", "training.zero"),
    ("reduce_bucket_size", "training.reduce_bucket_size"),
    ("allgather_bucket_size", "training.allgather_bucket_size"),
    ("logits", "training.logits"), ("logits_chunk", "training.logits_chunk"),
    ("zero_grad", "training.zero_grad"), ("expert_imbalance", "training.expert_imbalance"),
    ("expert_capacity", "training.expert_capacity"), ("expert_pad", "training.expert_pad"),
    ("eval_batch", "training.eval_batch"), ("eval_seq_len", "training.eval_seq_len"),
    ("target_len", "training.target_len"), ("vision_tower", "training.vision_tower"),
    ("offload", "training.offload"), ("checkpoint", "training.checkpoint"),
    ("device", "device.memory"), ("budget", "device.budget"),
    ("runtime_reserve", "device.runtime_reserve"), ("peak_tflops", "device.peak_tflops"),
    ("efficiency", "device.efficiency"), ("fragmentation", "device.fragmentation"),
    ("interconnect", "device.interconnect_gbps"), ("pcie", "device.pcie_gbps"),
    ("allocator", "device.allocator"), ("max_split_size", "device.max_split_size"),
    ("blas_workspace", "device.blas_workspace"),
    ("global_batch", "global_batch"), ("max_micro_batch", "max_micro_batch"),
    ("calib", "calib"),
    ("attention", None),  # the model's: ml_model_set_attention, before the job
)
FIT_ONLY = ("global_batch", "max_micro_batch")
# the library's limit on an input file (docs/robustness.md, "input limits")
MAX_INPUT = 16 << 20
IO_STATUS = 1  # ML_IO (include/memledger/error.h)


# the keywords that switch a setting on or off: True/False, or the strings
# the library takes ("on"/"off" for sp, "true"/"false"); the command line
# has flags without a value for them
SWITCHES = {"sp": ("on", "off", "auto"), "dist_optimizer": ("true", "false"),
            "overlap_grad_reduce": ("true", "false"), "expert_pad": ("true", "false")}


def switch(name, value):
    """A switch keyword's value as True, False or None (sp's "auto": not
    given); anything else is refused, naming what it takes."""
    if isinstance(value, bool):
        return value
    words = SWITCHES[name]
    if isinstance(value, str) and value in words + ("true", "false", "on", "off"):
        return None if value == "auto" else value in ("on", "true")
    raise ValueError("memledger: %s=%r: give True or False (or %s)"
                     % (name, value, ", ".join(repr(w) for w in words)))


def _whole(name, value):
    """A whole number of a list keyword (checkpoint=[1, 3], pp_layers=...):
    a float, a bool or a string is refused, never cut to an integer."""
    if isinstance(value, bool):
        raise TypeError("memledger: %s: %r is not a whole number" % (name, value))
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError("memledger: %s: %r is not a whole number" % (name, value)) from None


def split_mib(value):
    """max_split_size= as whole MiB, as the flag counts it: a whole number
    (or its digits as a string) is MiB, a size with a unit ("128MiB") is
    converted; a size that is not whole MiB, a float or a bool is refused."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError("memledger: max_split_size=%r: a whole number of MiB, or a size such "
                        "as '128MiB'" % (value,))
    if isinstance(value, int) or value.strip().isdigit():
        return int(value)
    if "\0" in value:
        raise ValueError("memledger: max_split_size=%r: a NUL character" % (value,))
    out, err = ctypes.c_uint64(), _native.new_error()
    st = lib.ml_parse_size(value.encode(), ctypes.byref(out), ctypes.byref(err))
    if st:
        err.msg = ("max_split_size=%r: " % (value,)).encode()[:100] + err.msg[:400]
    _native.check(st, err)
    b = out.value
    if b % (1 << 20):
        raise ValueError("memledger: max_split_size=%r: %d B is not a whole number of MiB "
                         "(PyTorch's max_split_size_mb counts MiB)" % (value, b))
    return b >> 20


def _text(name, value):
    """A keyword's value as the flag's text."""
    if name in SWITCHES:
        on = switch(name, value)
        if name == "sp":
            return "auto" if on is None else "on" if on else "off"  # --sp / --no-sp
        return "true" if on else "false"  # --dist-optimizer, --expert-pad
    if isinstance(value, bool):
        raise TypeError("memledger: %s=%r: not a flag value" % (name, value))
    if name == "pp_layers" and isinstance(value, (list, tuple)):
        return ",".join(str(_whole(name, n)) for n in value)  # --pp-layers 7,9,9,7
    if name == "max_split_size":
        return "%dMiB" % split_mib(value)  # --max-split-size counts MiB
    if name == "checkpoint" and isinstance(value, (list, tuple)):
        return "[%s]" % ", ".join(str(_whole(name, b)) for b in value)
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str) and "\0" in value:
        raise ValueError("memledger: %s=%r: a NUL character" % (name, value))
    if isinstance(value, (int, float, str)):
        return str(value)
    raise TypeError("memledger: %s=%r: give a number or a string" % (name, value))


def check_known(verb, name, known):
    """Refuses a keyword not in known: one another verb takes says which
    verbs take it, else the nearest known one."""
    if name in known:
        return
    takers = [v for v, extra in _cli.EXTRA.items() if name in extra]
    if takers:
        raise TypeError("memledger.%s: %s= is not for %s (%s take%s it)"
                        % (verb, name, verb, ", ".join(takers), "s" if len(takers) == 1 else ""))
    near = difflib.get_close_matches(name, known, n=1)
    hint = "; did you mean %r?" % near[0] if near else ""
    raise TypeError("memledger.%s: unknown keyword %r%s" % (verb, name, hint))


def _check_names(verb, settings, training):
    known = [k for k, _ in SETTINGS]
    for name in settings:
        check_known(verb, name, known)
        if name in FIT_ONLY and verb != "fit":
            raise TypeError("memledger.%s: %s is for fit" % (verb, name))
    if "micro_batches" in settings and "grad_accum" in settings:
        raise TypeError("memledger.%s: micro_batches= and grad_accum= are the same steps: "
                        "give one" % verb)
    if training is not None and verb == "calibrate_points":
        raise TypeError("memledger.calibrate_points: no model, no training file")


def _path(name, value):
    """A path as bytes for C, refused with a NUL inside: C would read it
    cut there (plan("gpt2-small.yaml\\0junk") planned gpt2-small)."""
    path = os.fsencode(value)
    if b"\0" in path:
        raise ValueError("memledger: %s=%r: a NUL character in a path" % (name, value))
    return path


def _is_hf_config(path):
    """Whether a model path names a Hugging Face config: a .json file, or
    a folder (its config.json, as from_pretrained takes it)."""
    return os.fsdecode(path).endswith(".json") or os.path.isdir(path)


def _load_model(model, training):
    """An ml_model handle from a path (model YAML, or a Hugging Face
    config.json or the model folder that holds one), a memledger model dict, or a Hugging Face config (a dict
    with model_type, or an object with to_dict(): PretrainedConfig)."""
    handle, err = ctypes.c_void_p(), _native.new_error()
    if hasattr(model, "to_dict") and callable(model.to_dict):
        model = model.to_dict()
    if isinstance(model, (str, os.PathLike)):
        path = _path("model", model)
        if _is_hf_config(path):
            train = _path("training", training) if training is not None else None
            st = lib.ml_model_load_hf(path, train, ctypes.byref(handle), ctypes.byref(err))
        elif training is not None:
            raise TypeError("memledger: training= goes with a Hugging Face config.json "
                            "(a model file has its own training: section)")
        else:
            st = lib.ml_model_load_file(path, ctypes.byref(handle), ctypes.byref(err))
    elif isinstance(model, dict):
        if training is not None:
            raise TypeError("memledger: training= goes with a config.json path; give the "
                            "settings as keywords")
        # JSON is YAML (flow style): the library's own loader reads the dict
        text = json.dumps(model, default=str).encode()
        if "model_type" in model and "model" not in model:
            # named in messages as the command line's path names it; the
            # model's name is _name_or_path's, else its model_type
            st = lib.ml_model_load_hf_string(text, len(text), b"<dict>", ctypes.byref(handle),
                                             ctypes.byref(err))
        else:
            st = lib.ml_model_load_string(text, len(text), b"<dict>", ctypes.byref(handle),
                                          ctypes.byref(err))
    else:
        raise TypeError("memledger: the model is a YAML or config.json path, a dict, or a "
                        "Hugging Face config (to_dict()), not %s" % type(model).__name__)
    _native.check(st, err)
    return handle


def _run(verb, model, settings, training=None):
    """Loads the model, applies the settings and returns the verb's JSON."""
    _check_names(verb, settings, training)
    handle = _load_model(model, training)
    job = ctypes.c_void_p()
    try:
        err = _native.new_error()
        if settings.get("attention") is not None:
            value = settings["attention"]
            st = lib.ml_model_set_attention(handle, _text("attention", value).encode(),
                                            ctypes.byref(err))
            if st:
                err.msg = ("attention=%r: " % (value,)).encode()[:100] + err.msg[:400]
            _native.check(st, err)
        _native.check(lib.ml_job_create(handle, ctypes.byref(job), ctypes.byref(err)), err)
        for name, key in SETTINGS:
            value = settings.get(name)
            if value is None or key is None:
                continue
            st = lib.ml_job_set(job, key.encode(), _text(name, value).encode(),
                                ctypes.byref(err))
            if st:
                err.msg = ("%s=%r: " % (name, value)).encode()[:100] + err.msg[:400]
            _native.check(st, err)
        call = getattr(lib, "ml_job_%s_json" % verb)
        try:
            return json.loads(_native.take_json(call, job))
        except Error as e:
            raise _in_keywords(e, settings) from None
    finally:
        lib.ml_job_destroy(job)
        lib.ml_model_destroy(handle)


def _in_keywords(e, settings):
    """e with the library's keys it names written as the keywords given
    (training.grad_accum as micro_batches= where that was the keyword), as
    the command line writes them as its flags."""
    msg = e.message
    for name, key in SETTINGS:
        if key and key in msg and name in settings:  # (a model file's keys stay its keys)
            msg = re.sub(r"(?<![\w.])%s(?![\w])" % re.escape(key), name + "=", msg)
    return Error(e.code, e.status, e.path, e.line, e.col, msg)


def _through_cli(settings):
    """Whether the verb runs through the command line (memledger._cli):
    sample lengths and a start state are read there. Those keywords given
    as None are dropped from settings (not given), as the library's
    keywords are."""
    for k in _cli.LENGTHS + _cli.START:
        if k in settings and settings[k] is None:
            del settings[k]
    return any(k in settings for k in _cli.LENGTHS + _cli.START)


def plan(model, training=None, **settings):
    """The ledger of one training iteration (memledger plan --format json):
    a dict with params, config, bytes, peak, flops, device (its fits: the
    verdict), advice, ...
    model: a model YAML path, a dict in the model file's schema, a Hugging
    Face config.json path, config dict or PretrainedConfig; training: a YAML
    with training: and device: sections for a config.json path (--training).
    Keywords as the flags: micro_batch=4, precision="amp-bf16",
    checkpoint="full", device="8GiB", budget="6.5GiB", zero=3, calib=PATH...;
    with lengths= (and batching=, max_tokens=, buckets=) the plan over
    sample lengths, as memledger.lengths(); with allocator_start=TRACE the
    simulated cache starts from the state that allocator trace leaves
    (--allocator-start)."""
    if _through_cli(settings):
        return _cli.json_verb("plan", model, training, settings)
    return _run("plan", model, settings, training)


def fit(model, training=None, **settings):
    """The largest micro-batch that fits and the accumulation steps
    (memledger fit --format json); also global_batch=, max_micro_batch=,
    checkpoint="auto". Needs a device (device= or the model's device:).
    With lengths= (and batching=, max_tokens=, buckets=), over sample
    lengths, run through the command line; with gpus= (and gpus_per_node=,
    network=, exhaustive=) the search over parallel layouts, as fit --gpus."""
    if _through_cli(settings) or any(k in settings for k in _cli.SEARCH):
        return _cli.json_verb("fit", model, training, settings)
    return _run("fit", model, settings, training)


def compare(model, training=None, **settings):
    """Checkpoint policies side by side: a list of row dicts
    (memledger compare --format json)."""
    if _through_cli(settings):
        return _cli.json_verb("compare", model, training, settings)
    return _run("compare", model, settings, training)


def timeline(model, training=None, **settings):
    """Every allocation and free of one iteration: a list of event dicts
    (memledger timeline --format json)."""
    if settings.get("allocator_start") is not None:
        raise TypeError("memledger.timeline: allocator_start= does not change the events, "
                        "which are the allocated view; plan(allocator_start=...) reports "
                        "the reserved figures a start state moves")
    settings.pop("allocator_start", None)  # None: not given
    return _run("timeline", model, settings, training)


def _size(name, value):
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < 2**64:
            raise ValueError("memledger: %s=%r: a byte count from 0 to 2**64 - 1" % (name, value))
        return value
    out, err = ctypes.c_uint64(), _native.new_error()
    st = lib.ml_parse_size(_text(name, value).encode(), ctypes.byref(out), ctypes.byref(err))
    if st:
        err.msg = ("%s=%r: " % (name, value)).encode()[:100] + err.msg[:400]
    _native.check(st, err)
    return out.value


def calibrate_points(points, budget=None, at=None):
    """Fits measured peaks to fixed + per-sample bytes (memledger calibrate
    --points FILE --format json). points: a CSV path (columns micro_batch
    and peak), or (micro_batch, peak) pairs or dicts with those keys (peak
    in bytes or as a size, "5.4GiB"); budget: bytes or a size; at: a
    micro-batch whose peak to predict."""
    if isinstance(points, (str, os.PathLike)):
        name = _path("points", points)
        # one byte past the library's limit, which it then refuses by name:
        # a stream (/dev/zero, a pipe) is never read to its end
        try:
            with open(points, "rb") as f:
                text = f.read(MAX_INPUT + 1)
        except OSError as e:
            raise Error(lib.ml_status_name(IO_STATUS).decode(), IO_STATUS, os.fsdecode(name), 0, 0,
                        "cannot read the points: %s" % (e.strerror or e)) from None
    else:
        rows = ["micro_batch,peak"]
        for p in points:
            if not isinstance(p, dict) and (isinstance(p, (str, bytes)) or not
                                            hasattr(p, "__len__") or len(p) != 2):
                raise ValueError("memledger.calibrate_points: %r: a point is (micro_batch, "
                                 "peak) or a dict with those keys" % (p,))
            mb, peak = (p["micro_batch"], p["peak"]) if isinstance(p, dict) else p
            cells = (_text("micro_batch", mb), _text("peak", peak))
            for c in cells:
                if any(ch in c for ch in ",\r\n"):
                    raise ValueError("memledger.calibrate_points: %r: one value a cell (no "
                                     "comma or line break)" % c)
            rows.append("%s,%s" % cells)
        name, text = b"<points>", ("\n".join(rows) + "\n").encode()
    b = _size("budget", budget) if budget is not None else 0
    if budget is not None and not b:
        raise ValueError("memledger.calibrate_points: budget=%r: at least 1 byte (leave it out "
                         "for no budget)" % (budget,))
    if at is not None and (isinstance(at, bool) or not isinstance(at, int)):
        raise TypeError("memledger.calibrate_points: at=%r: a whole micro-batch" % (at,))
    a = at if at is not None else 0
    if at is not None and not 1 <= a <= 2**24:
        raise ValueError("memledger.calibrate_points: at=%r: a micro-batch from 1 to 16777216"
                         % at)
    return json.loads(_native.take_json(lib.ml_points_json, text, len(text), name, b, a))
