"""The verbs whose writers live in the command line rather than in the
library (sample lengths, triage, colocate, report, allocator, the emitted
settings): run as `memledger VERB ... --format json` by the executable the
wheel carries, their output parsed, so each returns exactly what the command
line prints (docs/cli.md). Keyword arguments are the flags' names, as for
plan (--oom-phase is oom_phase=)."""
import json
import os
import re
import shutil
import subprocess
import tempfile

from . import _api
from ._native import Error, visible

_HERE = os.path.dirname(os.path.abspath(__file__))

# the flags each verb takes beyond plan's settings (SETTINGS); sample
# lengths are plan's, fit's and triage's
LENGTHS = ("lengths", "batching", "max_tokens", "buckets")
# the cache a simulation starts from (--allocator-start TRACE): a file the
# command line reads, so the verbs given it run through the command line
START = ("allocator_start",)
# fit --gpus N: the search over layouts, the command line's
SEARCH = ("gpus", "gpus_per_node", "network", "exhaustive")
EXTRA = {
    "plan": LENGTHS + START,
    "fit": LENGTHS + ("global_batch", "max_micro_batch") + START + SEARCH,
    "triage": LENGTHS + ("oom_phase", "allocated", "reserved") + START,
    "report": ("global_batch",) + START, "emit": START,
    "compare": START,
}
ALLOCATOR = ("device", "allocator", "max_split_size", "gc_threshold",
             "roundup_power2_divisions", "allocator_start")
COLOCATE = ("device", "budget")


class EmitWarning(UserWarning):
    """--emit wrote settings that lack a part of the plan (exit status 4):
    the message names what must be applied in code."""


def executable():
    """MEMLEDGER_EXECUTABLE, else the memledger the wheel carries, else one
    on PATH."""
    env = os.environ.get("MEMLEDGER_EXECUTABLE")
    if env:
        return env
    bundled = os.path.join(_HERE, "_lib", "memledger")
    if os.path.exists(bundled):
        return bundled
    found = shutil.which("memledger")
    if found:
        return found
    raise FileNotFoundError("memledger: the memledger executable was not found: install the "
                            "package with 'pip install .' from a checkout, or set MEMLEDGER_EXECUTABLE")


def _flag_value(name, value):
    # the command line's --max-split-size counts MiB, as max_split_size= does
    if name == "max_split_size":
        return str(_api.split_mib(value))
    return _api._text(name, value)


def _flags(verb, settings, known):
    """--flag value pairs in SETTINGS' order, then the verb's own."""
    names = [k for k, _ in _api.SETTINGS if k not in _api.FIT_ONLY]
    names += [k for k in known if k not in names]  # each flag once: given twice is refused
    for name in settings:
        _api.check_known(verb, name, names)
    out = []
    for name in names:
        value = settings.get(name)
        if name in _api.SWITCHES and value is not None:
            on = _api.switch(name, value)  # flags without a value: --sp, --no-sp, ...
            if on is None:
                raise ValueError("memledger.%s: sp='auto' through the command line (lengths=, "
                                 "triage, ...): give True or False, or leave sp out for the "
                                 "model file's setting" % verb)
            flag = "--" + name.replace("_", "-")
            out.append(flag if on else "--no-" + flag[2:])
        elif name == "exhaustive" and value is not None:
            if not isinstance(value, bool):
                raise TypeError("memledger.%s: exhaustive=%r: True or False" % (verb, value))
            out += ["--exhaustive"] if value else []
        elif value is not None:
            out += ["--" + name.replace("_", "-"), _flag_value(name, value)]
    return out


def _error(status, stderr, aliases):
    """Error from the command line's message ('memledger: error: PATH:LINE:COL:
    message', docs/cli.md): code "CLI", status the exit status."""
    text = stderr.decode("utf-8", "replace")
    for tmp, shown in aliases.items():
        text = text.replace(tmp, shown)
    first = next((ln for ln in text.splitlines() if ln.startswith("memledger: error: ")),
                 text.strip().splitlines()[0] if text.strip() else "exit status %d" % status)
    msg = first[len("memledger: error: "):] if first.startswith("memledger: error: ") else first
    path, line, col = "", 0, 0
    parts = msg.split(":", 3)
    if len(parts) == 4 and parts[1].isdigit() and parts[2].isdigit():
        path, line, col, msg = parts[0], int(parts[1]), int(parts[2]), parts[3].lstrip()
    return Error("CLI", status, path, line, col, msg)


def run(argv, ok=(0, 1), aliases=None):
    """Runs memledger with argv; returns (exit status, stdout bytes, stderr
    text). A status outside ok raises Error."""
    for a in argv:
        if "\0" in a:
            raise ValueError("memledger: %r: a NUL character" % a)
    p = subprocess.run([executable()] + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       stdin=subprocess.DEVNULL, check=False)
    if p.returncode not in ok:
        raise _error(p.returncode, p.stderr, aliases or {})
    return p.returncode, p.stdout, visible(p.stderr.decode("utf-8", "replace"))


class _Model:
    """The model as command-line arguments: a path as it is (config.json, or
    the model folder that holds one, with --hf, and training= as --training), a dict or a PretrainedConfig written
    to a temporary file first, removed on exit. aliases: that file's name ->
    what messages say instead ("<dict>", as the library names it)."""

    def __init__(self, model, training):
        self.dir, self.aliases = None, {}
        if hasattr(model, "to_dict") and callable(model.to_dict):
            model = model.to_dict()
        if isinstance(model, (str, os.PathLike)):
            path = os.fsdecode(_api._path("model", model))
            if _api._is_hf_config(path):
                self.args = ["--hf", path]
                if training is not None:
                    self.args += ["--training", os.fsdecode(_api._path("training", training))]
                return
            if training is not None:
                raise TypeError("memledger: training= goes with a Hugging Face config.json "
                                "(a model file has its own training: section)")
            self.args = [path]
            return
        if not isinstance(model, dict):
            raise TypeError("memledger: the model is a YAML or config.json path, a dict, or a "
                            "Hugging Face config (to_dict()), not %s" % type(model).__name__)
        if training is not None:
            raise TypeError("memledger: training= goes with a config.json path; give the "
                            "settings as keywords")
        self.dir = tempfile.mkdtemp(prefix="memledger-")
        text = json.dumps(model, default=str)  # JSON is YAML (flow style)
        if "model_type" in model and "model" not in model:
            # the folder's name is the plan's name when the config has none
            # (a safe file name: "..", "/" or a NUL cannot leave the directory)
            name = re.sub(r"[^A-Za-z0-9._-]", "_",
                          str(model.get("_name_or_path") or model["model_type"]))[:100]
            folder = os.path.join(self.dir, name if name.strip(".") else "hf-model")
            os.mkdir(folder)
            path = os.path.join(folder, "config.json")
            self.args = ["--hf", path]
        else:
            path = os.path.join(self.dir, "model.yaml")
            self.args = [path]
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        self.aliases = {path: "<dict>"}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def model_verb(verb, model, training, settings, extra=(), ok=(0, 1)):
    """`memledger VERB MODEL flags... extra...`: (exit status, stdout,
    stderr). verb "emit" runs plan (with --emit in extra)."""
    if settings.get("checkpoint") == "auto" and verb != "fit":
        raise TypeError("memledger.%s: checkpoint='auto' is fit's" % verb)
    flags = _flags(verb, settings, EXTRA[verb])
    with _Model(model, training) as m:
        argv = ["plan" if verb == "emit" else verb] + m.args + flags + list(extra)
        return run(argv, ok=ok, aliases=m.aliases)


def json_verb(verb, model, training, settings):
    """A verb's --format json report; a configuration that does not fit (exit
    status 1) is a report, not a failure."""
    _, out, _ = model_verb(verb, model, training, settings, ["--format", "json"])
    return json.loads(out.decode("utf-8"))


def _quote(token):
    """A job's token quoted as colocate splits a job (blanks; '...' and
    "..." quote)."""
    if token and not any(c in token for c in " \t\n'\""):
        return token
    if "'" not in token:
        return "'%s'" % token
    if '"' not in token:
        return '"%s"' % token
    raise ValueError("memledger.colocate: %r holds both quote characters" % token)


def job_spec(job):
    """A colocate job as one argument: a path, a (model, {settings}) pair, or
    a string already in the command line's form ("a.yaml --micro-batch 4")."""
    if isinstance(job, os.PathLike):
        return _quote(os.fspath(job))
    if isinstance(job, str):
        return job
    if isinstance(job, (tuple, list)) and len(job) == 2 and isinstance(job[1], dict):
        model, settings = job
        if not isinstance(model, (str, os.PathLike)):
            raise TypeError("memledger.colocate: a job's model is a path")
        flags = _flags("colocate", settings, ())
        return " ".join(_quote(t) for t in [os.fspath(model)] + flags)
    raise TypeError("memledger.colocate: a job is a path, a (path, {settings}) pair or a "
                    "string such as 'a.yaml --micro-batch 4', not %r" % (job,))
