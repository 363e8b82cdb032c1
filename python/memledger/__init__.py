"""memledger from Python: plan GPU training memory before launching a job.

    import memledger
    r = memledger.plan("models/gpt2-small.yaml", micro_batch=4, device="8GiB")
    r["params"], r["bytes"]["peak_total"], r["device"]["fits"]

plan, fit, compare, timeline, calibrate_points, lengths, triage, colocate
and allocator return what the command line prints with --format json
(docs/cli.md) as dicts and lists; report the HTML report; emit a plan's
settings for DeepSpeed, the HF Trainer or torch. Keyword arguments are the
flags' names (--micro-batch: micro_batch=). Failures raise memledger.Error
(code, path, line, col, message). A ctypes binding to libmemledger
(include/memledger/json.h) for the first five; the others run the memledger
executable the package carries; README.md, "From Python".
"""
from ._api import SETTINGS, calibrate_points, compare, fit, plan, timeline
from ._cli import EmitWarning
from ._native import Error
from ._verbs import allocator, colocate, emit, lengths, report, triage

__all__ = ["plan", "fit", "compare", "timeline", "calibrate_points", "lengths", "triage",
           "colocate", "report", "allocator", "emit", "Error", "EmitWarning", "SETTINGS"]
__version__ = "0.1.0"
