"""lengths, triage, colocate, report, allocator and emit: the verbs whose
writers are the command line's, run through it (_cli.py); each returns what
`memledger VERB ... --format json` prints (docs/cli.md), the report its
HTML and emit the target's settings."""
import csv
import io
import json
import os
import shutil
import tempfile
import warnings

from . import _api, _cli


def lengths(model, lengths, training=None, **settings):
    """A plan over sample lengths (memledger plan --lengths ... --format
    json): the plan's dict with its "lengths" section. lengths: a CSV path
    (one length a line, or a length column) or quantiles as the flag takes
    them, "p50=120,p99=480,max=512"; also batching=, max_tokens=, buckets=
    and every plan keyword. plan(), fit() and triage() take lengths= too."""
    settings["lengths"] = lengths
    return _cli.json_verb("plan", model, training, settings)


def triage(model, training=None, **settings):
    """What an out-of-memory peak is made of and each remedy, re-planned
    (memledger triage --format json). Keywords as plan's, and oom_phase=
    ("forward", "backward", "optimizer", "eval"), allocated= and reserved=
    (the failing run's torch.cuda.max_memory_allocated() and
    max_memory_reserved(), bytes or sizes), lengths=."""
    return _cli.json_verb("triage", model, training, settings)


def colocate(jobs, device, budget=None):
    """Jobs sharing one device, each in its own process (memledger colocate
    --format json, docs/colocate.md). jobs: two or more, each a model path,
    a (path, {keyword: value}) pair with plan's keywords, or a string in the
    command line's form ("a.yaml --micro-batch 4"); device: a name or a size.
    A set of jobs that does not fit is a report, not a failure."""
    specs = [_cli.job_spec(j) for j in jobs]
    opts = {"device": device}
    if budget is not None:
        opts["budget"] = budget
    flags = _cli._flags("colocate", opts, _cli.COLOCATE)
    _, out, _ = _cli.run(["colocate"] + flags + ["--format", "json"] + specs)
    return json.loads(out.decode("utf-8"))


def report(model, output=None, training=None, **settings):
    """The self-contained HTML report (memledger report): its text, or with
    output= a path, written there (atomically) and the path returned.
    Keywords as plan's, and global_batch=."""
    if output is None:
        _, out, _ = _cli.model_verb("report", model, training, settings, ["-o", "-"], ok=(0,))
        return out.decode("utf-8")
    path = os.fsdecode(_api._path("output", output))
    _cli.model_verb("report", model, training, settings, ["-o", path], ok=(0,))
    return output


def allocator(trace, **options):
    """A trace of allocations and frees through the model of PyTorch's
    caching allocator (memledger allocator --format json): the allocated
    and reserved peaks, segments, and with device= the out-of-memory event.
    trace: a CSV path (action,id,bytes), or rows ("alloc", id, bytes) and
    ("free", id). Keywords: device=, allocator= ("caching", "expandable",
    "none"), max_split_size= (MiB, as the flag), gc_threshold=,
    roundup_power2_divisions=, allocator_start= (a trace whose state the
    replay starts from). Running out of memory is a report."""
    flags = _cli._flags("allocator", options, _cli.ALLOCATOR)
    # only the allocator's own options
    plan_only = [k for k in options if k not in _cli.ALLOCATOR]
    if plan_only:
        raise TypeError("memledger.allocator: %r is not an allocator option" % plan_only[0])
    if isinstance(trace, (str, os.PathLike)):
        path = os.fsdecode(_api._path("trace", trace))
        _, out, _ = _cli.run(["allocator", path] + flags + ["--format", "json"])
        return json.loads(out.decode("utf-8"))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["action", "id", "bytes"])
    for row in trace:
        w.writerow([_api._text("trace", v) for v in row])
    tmp = tempfile.mkdtemp(prefix="memledger-")
    try:
        path = os.path.join(tmp, "trace.csv")
        with open(path, "w", encoding="utf-8") as f:
            f.write(buf.getvalue())
        _, out, _ = _cli.run(["allocator", path] + flags + ["--format", "json"],
                             aliases={path: "<trace>"})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    r = json.loads(out.decode("utf-8"))
    r["trace"] = "<trace>"  # the rows', not the temporary file's (removed)
    return r


EMIT_TARGETS = ("deepspeed", "hf-trainer", "torch", "megatron", "torchtitan")


def emit(model, target, training=None, **settings):
    """The plan's settings for a training stack (memledger plan --emit
    TARGET): "deepspeed" a dict (the config's JSON); "hf-trainer" the
    Trainer's flags, "torch" the snippet, "megatron" Megatron-LM's
    arguments and "torchtitan" its TOML, as text. Settings that lack a
    part of the plan (exit status 4) come with an EmitWarning naming it; a
    plan that does not fit, or a target that runs another setup, raises
    Error (code "CLI", status the exit status)."""
    if target not in EMIT_TARGETS:
        raise ValueError("memledger.emit: target %r: one of %s" % (target,
                                                                    ", ".join(EMIT_TARGETS)))
    status, out, err = _cli.model_verb("emit", model, training, settings,
                                       ["--emit", target], ok=(0, 4))
    if status == 4:
        note = "\n".join(ln for ln in err.splitlines() if ln.startswith("memledger: note: "))
        warnings.warn(note or err.strip(), _cli.EmitWarning, stacklevel=2)
    text = out.decode("utf-8")
    return json.loads(text) if target == "deepspeed" else text
