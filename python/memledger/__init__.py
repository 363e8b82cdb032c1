"""memledger from Python: plan GPU training memory before launching a job.

    import memledger
    r = memledger.plan("models/gpt2-small.yaml", micro_batch=4, device="8GiB")
    r["params"], r["peak"]["total"], r["verdict"]

plan, fit, compare, timeline and calibrate_points return what the command
line prints with --format json (docs/cli.md) as dicts and lists; keyword
arguments are the flags' names (--micro-batch: micro_batch=). Failures
raise memledger.Error (code, path, line, col, message). A ctypes binding to
libmemledger (include/memledger/json.h); README.md, "From Python".
"""
from ._api import SETTINGS, calibrate_points, compare, fit, plan, timeline
from ._native import Error

__all__ = ["plan", "fit", "compare", "timeline", "calibrate_points", "Error", "SETTINGS"]
__version__ = "0.1.0"
