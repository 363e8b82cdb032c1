#!/usr/bin/env python3
"""Random and mutated command lines against the memledger binary.

Every invocation must end with an exit status the CLI documents (0 ran and
fits, 1 does not fit, 2 bad input or usage, 3 output failure, 4 --emit
settings written with part of the plan left to code), within
--timeout seconds of CPU time (the wall clock only catches a blocked run,
at 12 times that: a loaded machine must not fail a fast run), without a
sanitizer report on stderr, and without
leaving a temporary output file behind. The command lines mix every verb,
real flags with valid, edge and hostile values, flags where values belong,
unknown flags, and inputs from models/ and the golden cases' files.

usage: argv_fuzz.py MEMLEDGER SRC_DIR [--runs N] [--seed S] [--seconds T]
Prints one line per failure (with the argv to reproduce it) and a summary;
exits 1 when any invocation failed. --seconds bounds the whole run (the
runs done by then count)."""
import argparse
import os
import random
import resource
import shlex
import subprocess
import sys
import tempfile
import time

VERBS = ["plan", "fit", "compare", "timeline", "report", "calibrate", "allocator", "triage",
         "colocate", "devices", "bogus", ""]
FLAGS = {
    "--micro-batch": "int", "--seq-len": "int", "--grad-accum": "int",
    "--precision": ["fp32", "amp-bf16", "amp-fp16", "bf16-master", "fp16-master", "bf16"],
    "--optimizer": ["sgd", "sgd-momentum", "adam", "adamw", "adafactor", "adam-8bit", "lion"],
    "--optimizer-impl": ["for-loop", "foreach", "fused"],
    "--checkpoint": ["none", "full", "every-2", "every-0", "sqrt", "selective", "optimal",
                     "[0, 1]", "[99]", "[", "auto"],
    "--device": "size", "--budget": "size", "--runtime-reserve": "size",
    "--peak-tflops": "real", "--efficiency": "real", "--fragmentation": "real",
    "--interconnect": "real", "--pcie": "real",
    "--data-parallel": "int", "--zero": ["0", "1", "2", "3", "4", "fsdp"],
    "--offload": ["none", "optimizer", "params", "gpu"],
    "--global-batch": "int", "--max-micro-batch": "int",
    "--reduce-bucket-size": "int", "--allgather-bucket-size": "int",
    "--logits": ["kept", "released", "fused", "x"],
    "--zero-grad": ["set_to_none", "zero", "none"],
    "--eval-batch": "int", "--eval-seq-len": "int", "--logits-chunk": "int",
    "--allocator": ["none", "caching", "expandable", "buddy"],
    "--max-split-size": "int",
    "--format": ["text", "json", "csv", "svg", "html", "yaml"],
    "--emit": ["torch", "hf-trainer", "deepspeed", "jax"],
    "--hf": "file", "--training": "file", "--calib": "file", "--points": "file",
    "--at": "int", "-o": "out", "--output": "out",
    # not "cpu": the CPU backend really measures (many seconds of CPU by
    # design); "cuda" fails at once without a GPU, and is not built in CI
    "--backend": ["cuda", "none", "tpu"], "--dtype": ["fp32", "bf16", "fp8"],
    "--oom-phase": ["forward", "backward", "optimizer", "eval", "loss"],
    "--allocated": "size", "--reserved": "size",
    "--lengths": "file", "--batching": ["padded", "bucketed", "packed", "sorted"],
    "--max-tokens": "int", "--buckets": "int",
    "--help": None, "-h": None,
}
HOSTILE = ["", "-", "--", "-1", "0", "00", "1e3", "1.5", "nan", "inf", "-inf", "0x10",
           "18446744073709551615", "18446744073709551616", "99999999999999999999999",
           "1" * 300, "é", "\x1b[31mred", "a\nb", "%s%n", "8GiB", "8 GiB", "8GB", "1B",
           "0B", "16EiB", "9999999TiB", "-8GiB", "GiB", "--device", "-o",
           # escapes in flag values, sizes at 2^63, products that wrap
           "x\x1b]0;pwn\x07", "h100\x1b[31m", "1\x1b[2J", "9223372036854775807",
           "9223372036854775808", "16777216", "1048576"]


def value(kind, rng, files, outdir):
    if rng.random() < 0.15:
        return rng.choice(HOSTILE)
    if kind == "int":
        return str(rng.choice([0, 1, 2, 3, 7, 8, 16, 64, 1024, 2 ** 20, 2 ** 31, 2 ** 40]))
    if kind == "real":
        return rng.choice(["0", "0.5", "1", "1.5", "100", "1e300", "-1"])
    if kind == "size":
        return rng.choice(["1B", "1MiB", "256MiB", "8GiB", "24GiB", "80GB", "141GB", "1TiB"])
    if kind == "file":
        return rng.choice(files)
    if kind == "out":
        return os.path.join(outdir, rng.choice(["out.txt", "sub/none.txt", "x" * 250]))
    return rng.choice(kind)


def argv_for(rng, files, outdir):
    verb = rng.choice(VERBS)
    args = [verb] if verb else []
    if rng.random() < 0.9:
        args.append(rng.choice(files))
    for _ in range(rng.randint(0, 6)):
        flag = rng.choice(list(FLAGS) + ["--nope", "-x", "--device="])
        kind = FLAGS.get(flag)
        if kind is None or flag.endswith("="):
            args.append(flag)
            continue
        v = value(kind, rng, files, outdir)
        if rng.random() < 0.2:
            args.append(flag + "=" + v)
        elif rng.random() < 0.05:
            args.append(flag)  # the value missing
        else:
            args += [flag, v]
    if verb == "colocate":  # jobs: a model file with its own options in one argument
        for _ in range(rng.randint(0, 3)):
            job = [rng.choice(files)]
            for _ in range(rng.randint(0, 3)):
                flag = rng.choice(["--micro-batch", "--peak-tflops", "--precision", "--device",
                                   "--seq-len", "--checkpoint", "-o"])
                kind = FLAGS.get(flag)
                job += [flag, value(kind, rng, files, outdir)]
            args.append(" ".join(job) if rng.random() < 0.9 else "'" + " ".join(job))
    if rng.random() < 0.1 and args:  # mutate: drop, duplicate or swap one argument
        i = rng.randrange(len(args))
        op = rng.choice(["drop", "dup", "swap"])
        if op == "drop":
            del args[i]
        elif op == "dup":
            args.insert(i, args[i])
        else:
            j = rng.randrange(len(args))
            args[i], args[j] = args[j], args[i]
    return args


def inputs(src):
    files = []
    for d, pats in ((os.path.join(src, "models"), (".yaml", ".csv")),
                    (os.path.join(src, "tests", "cli", "cases"), (".yaml", ".csv", ".json")),
                    (os.path.join(src, "calib", "profiles"), (".yaml",))):
        for root, _, names in os.walk(d):
            files += [os.path.join(root, n) for n in sorted(names) if n.endswith(pats)]
    files += [os.path.join(src, "models", "hf", h, "config.json")
              for h in sorted(os.listdir(os.path.join(src, "models", "hf")))]
    return files + ["/nonexistent.yaml", "/dev/null", src]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exe")
    ap.add_argument("src")
    ap.add_argument("--runs", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=240)
    ap.add_argument("--timeout", type=float, default=5)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    files = inputs(os.path.abspath(a.src))
    t0 = time.time()
    bad = done = 0
    with tempfile.TemporaryDirectory() as outdir:
        os.makedirs(os.path.join(outdir, "sub"), exist_ok=True)
        for i in range(a.runs):
            if time.time() - t0 > a.seconds:
                break
            args = argv_for(rng, files, outdir)
            why = None
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            try:
                # in the scratch folder: a relative output name lands there
                p = subprocess.run([os.path.abspath(a.exe)] + args, capture_output=True,
                                   timeout=12 * a.timeout, stdin=subprocess.DEVNULL, cwd=outdir)
                err = p.stderr.decode("utf-8", "replace")
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
                if p.returncode not in (0, 1, 2, 3, 4):
                    why = "exit status %d" % p.returncode
                elif "\x1b" in err or "\x07" in err or "\u009b" in err:
                    why = "a raw terminal escape on stderr (docs/cli.md: shown as \\xNN)"
                elif "Sanitizer" in err or "runtime error:" in err:
                    why = "sanitizer report: " + err.strip().splitlines()[0][:200]
                elif cpu > a.timeout:
                    why = "used %.1f s of CPU time (over %g s)" % (cpu, a.timeout)
            except subprocess.TimeoutExpired:
                why = "blocked: ran over %g s of wall-clock time" % (12 * a.timeout)
            left = [n for n in os.listdir(outdir) if ".tmp" in n or n.startswith(".")]
            for n in os.listdir(outdir):  # outputs the run was asked for: not kept
                if n not in left and n != "sub":
                    os.remove(os.path.join(outdir, n))
            left += [os.path.join("sub", n) for n in os.listdir(os.path.join(outdir, "sub"))
                     if ".tmp" in n or n.startswith(".")]
            if left and not why:
                why = "left temporary files: %s" % ", ".join(left)
            for n in left:
                os.remove(os.path.join(outdir, n))
            done += 1
            if why:
                bad += 1
                print("FAIL run %d: %s: memledger %s" % (i, why, " ".join(map(shlex.quote, args))))
    print("argv fuzz: %d invocations in %.1f s (seed %d), %d failed" % (
        done, time.time() - t0, a.seed, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
